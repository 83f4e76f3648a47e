"""Bench-only models: loaded by the *server* under test, never by the harness itself.

Serve one with ``zeroserve serve --model 'name=benchmarks.models:Class?opt=v'``.
Options after ``?`` reach the constructor (``self.options``) except the runtime keys
(``executor``, ``workers``, ``queue_depth``, ...), which configure the runtime.

* :class:`FloodModel` (W5): streams the same ``piece_kib`` KiB piece until ``total_mib``
  MiB were produced: a stream the model could produce at 100 MB.
* :class:`TickerModel` / :class:`AsyncTickerModel` (W6): one small piece every
  ``interval_ms``; after each piece the produced count and a CLOCK_MONOTONIC timestamp are
  written into the shared file named by the ``counter`` option, so the harness can see
  when the model really stopped (the model's own counter, not the server's word for it).
* :class:`SleepModel` (W7): ``infer`` sleeps ``ms`` (default 10) with ``time.sleep``:
  a known capacity of ``workers * 1000 / ms`` requests per second.
* :class:`SpinModel` (W8): ``infer`` spins pure-Python loops for ``ms`` (default 20) of
  CPU time, holding the GIL the whole time.
"""

from __future__ import annotations

import asyncio
import mmap
import os
import struct
import time
from collections.abc import AsyncIterator, Iterator, Sequence
from typing import ClassVar

from zeroserve.models.base import ExecutorKind, GenerateRequest, Inputs, Model, Outputs

KiB = 1024
MiB = 1024 * KiB

# The counter file: produced count (u64) and the monotonic time of the last piece (f64).
COUNTER_FORMAT = "<Qd"
COUNTER_SIZE = struct.calcsize(COUNTER_FORMAT)
# W6 streams are bounded even if nobody ever cancels them: 60 s of pieces at 1 ms.
TICKER_LIMIT = 60_000


def spin(ms: float) -> int:
    """Pure-Python busy work for ``ms`` milliseconds of this thread's CPU time (GIL held)."""
    end = time.thread_time() + ms / 1000.0
    n = 0
    while time.thread_time() < end:
        for i in range(500):  # ~20 us of bytecode between clock reads
            n += i * i % 7
    return n


def read_counter(path: str) -> tuple[int, float]:
    """(pieces produced, monotonic time of the last one) from a counter file."""
    with open(path, "rb") as f:
        data = f.read(COUNTER_SIZE)
    if len(data) < COUNTER_SIZE:
        return 0, 0.0
    count, last = struct.unpack(COUNTER_FORMAT, data)
    return int(count), float(last)


def create_counter(path: str) -> None:
    """Create (or zero) a counter file for :class:`TickerModel`'s ``counter`` option."""
    with open(path, "wb") as f:
        f.write(b"\0" * COUNTER_SIZE)


class FloodModel(Model):
    """W5: a producer that never waits on its own: 64 KiB pieces up to 100 MiB."""

    description: ClassVar[str] = "bench: streams piece_kib KiB pieces up to total_mib MiB"

    def load(self) -> None:
        self._piece = b"x" * int(float(self.options.get("piece_kib", 64)) * KiB)
        self._total = int(float(self.options.get("total_mib", 100)) * MiB)

    def generate(self, req: GenerateRequest) -> Iterator[bytes]:
        piece = self._piece
        n = self._total // len(piece)
        if req.max_tokens is not None:
            n = min(n, req.max_tokens)
        for _ in range(n):
            yield piece


class TickerModel(Model):
    """W6: one piece every ``interval_ms``, each recorded in the ``counter`` file."""

    description: ClassVar[str] = "bench: a piece every interval_ms, counted in a shared file"

    def load(self) -> None:
        self._interval = float(self.options.get("interval_ms", 1.0)) / 1000.0
        self._map: mmap.mmap | None = None
        path = self.options.get("counter")
        if path:
            fd = os.open(str(path), os.O_RDWR | os.O_CREAT, 0o600)
            try:
                if os.fstat(fd).st_size < COUNTER_SIZE:
                    os.ftruncate(fd, COUNTER_SIZE)
                self._map = mmap.mmap(fd, COUNTER_SIZE)
            finally:
                os.close(fd)

    def _limit(self, req: GenerateRequest) -> int:
        return min(req.max_tokens, TICKER_LIMIT) if req.max_tokens is not None else TICKER_LIMIT

    def _record(self) -> None:
        m = self._map
        if m is not None:
            count = struct.unpack_from("<Q", m, 0)[0]
            struct.pack_into(COUNTER_FORMAT, m, 0, count + 1, time.monotonic())

    def generate(self, req: GenerateRequest) -> Iterator[bytes]:
        for i in range(self._limit(req)):
            if i:
                time.sleep(self._interval)
            self._record()
            yield b"tick\n"


class AsyncTickerModel(TickerModel):
    """W6 on the inline executor: the same ticker as an async generator (the loop's)."""

    executor: ClassVar[ExecutorKind] = "inline"

    async def generate(self, req: GenerateRequest) -> AsyncIterator[bytes]:  # type: ignore[override]
        for i in range(self._limit(req)):
            if i:
                await asyncio.sleep(self._interval)
            self._record()
            yield b"tick\n"


class SleepModel(Model):
    """W7: ``ms`` of ``time.sleep`` per request (GIL released): a known capacity."""

    executor: ClassVar[ExecutorKind] = "thread"
    description: ClassVar[str] = "bench: sleeps ms per request"

    def infer(self, batch: Sequence[Inputs]) -> Sequence[Outputs]:
        time.sleep(float(self.options.get("ms", 10.0)) / 1000.0 * len(batch))
        return [{"raw": b"ok"} for _ in batch]


class SpinModel(Model):
    """W8: ``ms`` of pure-Python CPU work per request (GIL held throughout)."""

    executor: ClassVar[ExecutorKind] = "process"
    description: ClassVar[str] = "bench: spins Python loops for ms of CPU time per request"

    def infer(self, batch: Sequence[Inputs]) -> Sequence[Outputs]:
        ms = float(self.options.get("ms", 20.0))
        return [{"raw": str(spin(ms)).encode()} for _ in batch]


# --- models added by other suites go below this line ------------------------------------
