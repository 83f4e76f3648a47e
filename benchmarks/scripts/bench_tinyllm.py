"""Measure the tinyllm demo model: load time, time to first token, decode speed, and how
much of a decode step holds the GIL (which decides its executor). Prints; asserts nothing.

Run: ``.venv/bin/python -m benchmarks.scripts.bench_tinyllm`` (pin to one core with
``taskset -c 0`` for the one-core figures).

On a shared machine wall-clock rates swing with other people's load, so every figure is
also given per CPU-second of this process (``time.thread_time`` / ``process_time``): that
is the one-core speed, whatever the neighbours do.

Threading: N threads generate at once. ``parallelism`` = process CPU time / wall time; it
can exceed 1 only while numpy runs with the GIL released (BLAS matmuls, large ufuncs).
Tokens per CPU-second falling as N grows would mean GIL contention overhead.

Executor: the same generations run inline on an asyncio loop (one step per loop turn)
or each in a thread (``run_in_executor``), while a 1 ms ticker on the loop measures how
late it runs: that lateness is what every other request on the server would feel.
"""

from __future__ import annotations

import asyncio
import os
import statistics
import sys
import threading
import time

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
os.environ.setdefault("OMP_NUM_THREADS", "1")

from zeroserve import GenerateRequest
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


def one_stream(m: TinyLlamaModel, n: int = N_TOKENS, seed: int = 0) -> dict[str, float]:
    """TTFT and decode rate of one stream at temperature 0.8, wall and CPU time."""
    req = GenerateRequest(prompt=PROMPT, max_tokens=n, temperature=0.8, seed=seed)
    t0, c0 = time.perf_counter(), time.thread_time()
    gen = m.generate(req)
    next(gen)
    t1, c1 = time.perf_counter(), time.thread_time()
    count = 1
    for _ in gen:
        count += 1
    t2, c2 = time.perf_counter(), time.thread_time()
    return {
        "ttft_ms": (t1 - t0) * 1e3,
        "ttft_cpu_ms": (c1 - c0) * 1e3,
        "tps": (count - 1) / (t2 - t1),
        "tps_cpu": (count - 1) / (c2 - c1),
    }


def threaded(m: TinyLlamaModel, threads: int) -> dict[str, float]:
    """``threads`` concurrent greedy generations of N_TOKENS each (they never stop early)."""
    barrier = threading.Barrier(threads + 1)

    def work() -> None:
        barrier.wait()
        req = GenerateRequest(prompt=PROMPT, max_tokens=N_TOKENS, temperature=0.0)
        for _ in m.generate(req):
            pass

    ts = [threading.Thread(target=work) for _ in range(threads)]
    for t in ts:
        t.start()
    barrier.wait()
    t0, c0 = time.perf_counter(), time.process_time()
    for t in ts:
        t.join()
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    tokens = threads * N_TOKENS
    return {"tps": tokens / wall, "tps_cpu": tokens / cpu, "parallelism": cpu / wall}


async def _loop_lateness(m: TinyLlamaModel, executor: str, streams: int) -> dict[str, float]:
    """Run ``streams`` generations inline on an event loop, or each in a thread, while a
    1 ms ticker measures how late the loop runs it (what every other request would feel)."""
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    late: list[float] = []

    async def ticker() -> None:
        while not stop.is_set():
            t = time.perf_counter()
            await asyncio.sleep(0.001)
            late.append(time.perf_counter() - t - 0.001)

    def req() -> GenerateRequest:
        return GenerateRequest(prompt=PROMPT, max_tokens=N_TOKENS, temperature=0.0)

    async def inline() -> None:
        for _ in m.generate(req()):
            await asyncio.sleep(0)

    def drain() -> None:
        for _ in m.generate(req()):
            pass

    tick = asyncio.create_task(ticker())
    t0, c0 = time.perf_counter(), time.process_time()
    if executor == "inline":
        await asyncio.gather(*(inline() for _ in range(streams)))
    else:
        await asyncio.gather(*(loop.run_in_executor(None, drain) for _ in range(streams)))
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    stop.set()
    await tick
    late.sort()
    return {
        "tps": streams * N_TOKENS / wall,
        "tps_cpu": streams * N_TOKENS / cpu,
        "p50_ms": late[len(late) // 2] * 1e3,
        "p99_ms": late[int(len(late) * 0.99)] * 1e3,
    }


def main() -> None:
    print(f"python {sys.version.split()[0]}, cpus {os.cpu_count()}")
    print(f"load: {load_ms():.1f} ms (median of 5)")
    m = TinyLlamaModel()
    m.load()
    one_stream(m, 16)  # warm up
    runs = [one_stream(m, seed=s) for s in range(7)]

    def med(key: str) -> float:
        return statistics.median(r[key] for r in runs)

    print(
        f"time to first token: {med('ttft_ms'):.2f} ms wall, {med('ttft_cpu_ms'):.2f} ms CPU"
        f" (prompt {m.count_tokens(PROMPT) + 1} tokens)"
    )
    print(
        f"decode, one stream: {med('tps'):.0f} tokens/s wall,"
        f" {med('tps_cpu'):.0f} tokens per CPU-second"
    )
    for n in (1, 2, 4):
        r = threaded(m, n)
        print(
            f"{n} threads: {r['tps']:.0f} tokens/s wall, {r['tps_cpu']:.0f} tokens per"
            f" CPU-second, parallelism {r['parallelism']:.2f}"
        )
    for executor in ("inline", "thread"):
        for n in (1, 4):
            r = asyncio.run(_loop_lateness(m, executor, n))
            print(
                f"{executor:6s} x{n}: {r['tps']:.0f} tokens/s wall, {r['tps_cpu']:.0f} per"
                f" CPU-second; event-loop lateness p50 {r['p50_ms']:.2f} ms,"
                f" p99 {r['p99_ms']:.2f} ms"
            )


if __name__ == "__main__":
    main()
