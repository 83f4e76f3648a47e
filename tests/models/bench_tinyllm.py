"""Measure the tinyllm demo model: load time, time to first token, decode speed, and how
much of a decode step holds the GIL (which decides its executor). Prints; asserts nothing.

Run: ``.venv/bin/python tests/models/bench_tinyllm.py`` (pin to one core with
``taskset -c 0`` for the one-core figures). Not collected by pytest (no ``test_`` prefix).

GIL probe: a pure-Python thread counts while N generations run in other threads. The
share of its solo rate that it keeps tells how much time the generations leave the GIL
free; "aggregate tokens/s" for 2 threads against 1 tells whether two cores help.
"""

from __future__ import annotations

import os
import statistics
import sys
import threading
import time

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
os.environ.setdefault("OMP_NUM_THREADS", "1")

from zeroserve.models.base import GenerateRequest
from zeroserve.models.tinyllm import TinyLlamaModel

PROMPT = "<|user|>\nstr.split\n<|assistant|>\n"
N_TOKENS = 256


def load_ms() -> float:
    import safetensors.numpy  # noqa: F401  # exclude first-import cost from load time
    import tokenizers  # noqa: F401

    times = []
    for _ in range(5):
        t = time.perf_counter()
        TinyLlamaModel().load()
        times.append((time.perf_counter() - t) * 1e3)
    return statistics.median(times)


def one_stream(m: TinyLlamaModel, n: int = N_TOKENS, seed: int = 0) -> tuple[float, float, int]:
    """(ttft seconds, decode tokens/s after the first, tokens) at temperature 0.8."""
    req = GenerateRequest(prompt=PROMPT, max_tokens=n, temperature=0.8, seed=seed)
    t0 = time.perf_counter()
    gen = m.generate(req)
    next(gen)
    t1 = time.perf_counter()
    count = 1
    for _ in gen:
        count += 1
    t2 = time.perf_counter()
    return t1 - t0, (count - 1) / (t2 - t1), count


def tokens_per_s_threads(m: TinyLlamaModel, threads: int) -> float:
    """Aggregate generated tokens/s of ``threads`` concurrent max-length generations."""
    done = [0] * threads
    barrier = threading.Barrier(threads + 1)

    def work(i: int) -> None:
        barrier.wait()
        req = GenerateRequest(prompt=PROMPT, max_tokens=N_TOKENS, temperature=0.0)
        for _ in m.generate(req):
            done[i] += 1

    ts = [threading.Thread(target=work, args=(i,)) for i in range(threads)]
    for t in ts:
        t.start()
    barrier.wait()
    t0 = time.perf_counter()
    for t in ts:
        t.join()
    # Pieces undercount tokens slightly (a split character is one piece); count tokens.
    return threads * N_TOKENS / (time.perf_counter() - t0)


def python_rate(duration: float, stop: threading.Event | None = None) -> float:
    n = 0
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < duration and not (stop and stop.is_set()):
        n += 1
    return n / (time.perf_counter() - t0)


def gil_share(m: TinyLlamaModel) -> float:
    """Share of a pure-Python thread's solo speed it keeps while one generation runs."""
    solo = python_rate(1.0)
    stop = threading.Event()
    rate: list[float] = []
    th = threading.Thread(target=lambda: rate.append(python_rate(60.0, stop)))
    th.start()
    req = GenerateRequest(prompt=PROMPT, max_tokens=N_TOKENS, temperature=0.0)
    for _ in range(4):
        for _ in m.generate(req):
            pass
    stop.set()
    th.join()
    return rate[0] / solo


def main() -> None:
    print(f"python {sys.version.split()[0]}, cpus {os.cpu_count()}")
    print(f"load: {load_ms():.1f} ms (median of 5)")
    m = TinyLlamaModel()
    m.load()
    one_stream(m, 16)  # warm up
    runs = [one_stream(m, seed=s) for s in range(5)]
    ttft = statistics.median(r[0] for r in runs) * 1e3
    tps = statistics.median(r[1] for r in runs)
    print(f"time to first token: {ttft:.2f} ms (prompt {m.count_tokens(PROMPT) + 1} tokens)")
    print(f"decode: {tps:.0f} tokens/s, one stream ({N_TOKENS} tokens)")
    for n in (1, 2, 4):
        print(f"aggregate, {n} threads: {tokens_per_s_threads(m, n):.0f} tokens/s")
    print(f"pure-Python thread keeps {gil_share(m):.0%} of its solo speed beside 1 generation")


if __name__ == "__main__":
    main()
