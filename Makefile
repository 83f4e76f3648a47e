# Two commands on a fresh machine: `make serve` and `make test`. Each sets itself up first.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
HOST ?= 127.0.0.1
PORT ?= 8000

.PHONY: install serve test lint typecheck pytest bench bench-tools model clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[default-models,onnx,test,bench]'
	touch $(STAMP)

install: $(STAMP)

serve: install
	$(VENV)/bin/zeroserve serve --host $(HOST) --port $(PORT)

lint: install
	$(VENV)/bin/ruff check src tests benchmarks

typecheck: install
	$(VENV)/bin/mypy

pytest: install
	$(VENV)/bin/pytest -q -p no:cacheprovider

test: lint typecheck pytest

# Debian tools the benchmark drives: wrk (HTTP load) and h2load (nghttp2-client).
bench-tools:
	@command -v wrk >/dev/null && command -v h2load >/dev/null || \
	  (apt-get update -q && apt-get install -y -q wrk nghttp2-client)

bench: install bench-tools
	$(VENV)/bin/zeroserve bench

clean:
	rm -rf $(VENV) build dist src/*.egg-info .pytest_cache .mypy_cache .ruff_cache
