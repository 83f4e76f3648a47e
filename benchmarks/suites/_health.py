"""``/health`` probed from a process of its own while a stream suite loads the server.

A probe thread inside the load client's process measures that process too: its
asyncio loop (32 streams parsing SSE) holds the GIL against the probe thread, so a
/health answer that left the server in 0.2 ms can be read milliseconds later. The
probe runs in a separate process (spawned: no copy of the client's loop or threads),
which the OS schedules on its own, as a real monitoring client would be.
"""

from __future__ import annotations

import multiprocessing
from concurrent.futures import Future, ProcessPoolExecutor

from .w8 import _probe_health


def _latencies(port: int, seconds: float) -> list[float]:
    return _probe_health(port, seconds)[0]


class HealthProbe:
    """One spawned probe process, reused for every measurement of a suite."""

    def __init__(self) -> None:
        self._pool = ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn"))
        self._pool.submit(int).result()  # started (and imported) before any measurement

    def start(self, port: int, seconds: float) -> Future[list[float]]:
        """Probe ``port`` every 5 ms for ``seconds``; the future's result is the
        latencies in ms (the whole answer, measured in the probe process)."""
        return self._pool.submit(_latencies, port, seconds)

    def close(self) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)

    def __enter__(self) -> HealthProbe:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
