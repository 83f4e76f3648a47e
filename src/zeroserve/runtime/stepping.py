"""Sync generators stepped on pool threads, under their stream's credit: the thread
executor, process workers and Ray actors share it.

Strategy
--------
A generator is stepped only while its stream has credit (:class:`StreamCredit`, the
worker's side of the credit window), so a slow consumer stops its own generator and
nobody else's. :class:`ThreadStepper` steps one ``next()`` per pool call under a lock, so
an abort closes the generator right after the step in progress. :class:`SlicedSteps`
steps many per pool call, for at most ``STEP_SLICE_S``, and hands each piece to the loop
as it comes: a fast generator's pieces travel many to a frame (or a Ray item) while a
slow step still delivers its piece at once.

Invariant: a step in progress is never interrupted; closing waits for it to return (the
caller's task stays running meanwhile, which is how a hung step is seen).
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any, ClassVar

from .model_calls import run_to_end


class ThreadStepper:
    """Steps a sync generator one ``next()`` per pool call (thread executor and process
    workers alike). A lock serialises ``step`` and ``close`` so an abort that lands
    mid-step closes the generator right after that step; the generator's return value
    (a finish reason) is kept in ``result``."""

    END: ClassVar[object] = object()  # what ``step`` returns once the generator is exhausted

    def __init__(self, gen: Iterator[Any]) -> None:
        self.gen = gen
        self.result: Any = None
        self._lock = threading.Lock()

    def step(self) -> Any:
        with self._lock:
            try:
                return next(self.gen)
            except StopIteration as stop:
                self.result = stop.value
                return ThreadStepper.END

    def close(self) -> None:
        with self._lock:
            close = getattr(self.gen, "close", None)
            if close is not None:
                close()

    def close_in(self, pool: ThreadPoolExecutor) -> None:
        """Close the generator on a pool thread (it may be mid-step there)."""
        try:
            pool.submit(self.close)
        except RuntimeError:  # the pool is shut down
            pass


# How long one pool call keeps stepping a sync generator while its stream has credit, in
# seconds. Each piece goes to the loop as it comes, so this bounds neither a piece's wait
# nor a slow step; it bounds how long a fast generator holds a pool thread (shared by every
# stream and batch of a worker) and saves a thread hop per piece: measured on the echo
# model, a thread hop and a frame (or Ray item) per piece cost about 0.2 ms of CPU each
# side, more than the piece.
STEP_SLICE_S = 0.002


class _PieceQueue:
    """A stream's pieces on their way from a pool thread to the loop.

    ``put`` (any thread) appends and wakes the loop only when no wake-up is pending;
    ``take`` (the loop) clears that mark before it looks, so a piece appended after the
    look always sends a new wake-up, which lands after ``take`` cleared its event.
    """

    __slots__ = ("event", "items", "loop", "signalled")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.items: deque[Any] = deque()
        self.event = asyncio.Event()
        self.signalled = False

    def put(self, item: Any) -> None:
        self.items.append(item)
        if not self.signalled:
            self.signalled = True
            self.loop.call_soon_threadsafe(self.event.set)

    async def take(self) -> list[Any]:
        """Everything that arrived, waiting for at least one item."""
        while True:
            self.signalled = False
            items = self.items
            if items:
                return [items.popleft() for _ in range(len(items))]
            self.event.clear()
            await self.event.wait()


# What ``SlicedSteps.take`` returns as the end of a stream that was stopped.
STOPPED: Any = object()


class SlicedSteps:
    """A sync generator stepped on a pool thread in slices, under its stream's credit.

    A pump task takes one credit, then the rest of the stream's credit, and runs one pool
    call that steps the generator up to that many times for at most ``STEP_SLICE_S`` (at
    least one step), handing each piece to the loop as it comes; ``take`` returns what
    arrived since the last call. So a fast generator's pieces travel many to a frame (or a
    Ray item) and one thread hop serves many steps, while a slow step still delivers its
    piece at once. ``stopped()`` (an abort) ends a pool call after the step in progress.
    Process workers and Ray actors share it (docs/architecture.md, "Streaming channels").
    """

    __slots__ = ("_clock", "_out", "_pool", "_stopped", "_task", "credit", "stepper")

    def __init__(
        self,
        it: Iterator[Any],
        pool: ThreadPoolExecutor,
        credit: StreamCredit,
        stopped: Callable[[], bool],
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        loop = asyncio.get_running_loop()
        self.stepper = ThreadStepper(it)
        self.credit = credit
        self._pool = pool
        self._stopped = stopped
        self._clock = clock
        self._out = _PieceQueue(loop)
        self._task = loop.create_task(self._pump())

    @property
    def result(self) -> Any:
        """The generator's return value (a finish reason), once it ended."""
        return self.stepper.result

    def _steps(self, limit: int) -> tuple[int, bool]:
        """On a pool thread: step up to ``limit`` pieces, for at most ``STEP_SLICE_S``
        (at least one step); stop at the generator's end or once the stream was stopped.
        Returns how many steps ran and whether the generator ended."""
        clock = self._clock
        until = clock() + STEP_SLICE_S
        out, stepper = self._out, self.stepper
        n = 0
        while n < limit:
            piece = stepper.step()
            n += 1
            out.put(piece)
            if piece is ThreadStepper.END:
                return n, True
            if self._stopped() or clock() >= until:
                break
        return n, False

    async def _pump(self) -> None:
        loop = asyncio.get_running_loop()
        credit = self.credit
        try:
            while True:
                await credit.take()
                if self._stopped():
                    self._out.put(STOPPED)
                    return
                extra = max(0, credit.n)  # the rest of the credit, for this pool call
                credit.n -= extra
                steps = loop.run_in_executor(self._pool, self._steps, 1 + extra)
                n, ended = await run_to_end(steps)  # a thread cannot be stopped
                if ended:
                    return
                if n < 1 + extra:
                    credit.add(1 + extra - n)
        except Exception as exc:  # the model's: the stream turns it into a failure
            self._out.put(exc)

    async def take(self) -> tuple[list[Any], Any]:
        """The pieces produced since the last call (waiting for at least one item), and
        how the stream ended: ``None`` (it goes on), ``ThreadStepper.END`` (the generator
        returned: see ``result``), ``STOPPED``, or the model's exception."""
        batch = await self._out.take()
        last = batch[-1]
        if last is ThreadStepper.END or last is STOPPED or isinstance(last, BaseException):
            return batch[:-1], last
        return batch, None

    async def aclose(self) -> None:
        """Stop stepping and close the generator. Waits for a step in progress to return
        (the caller's task stays running meanwhile, which is how a hung step is seen)."""
        self._stopped = _always
        self._task.cancel()
        await asyncio.wait([self._task])
        self.stepper.close_in(self._pool)


def _always() -> bool:
    return True


class StreamCredit:
    """A worker's side of one stream's credit window (docs/architecture.md, "Streaming
    channels"): the producer takes one credit per piece sent and waits at zero; the
    server adds credits as its channel drains. Process workers and Ray actors share it."""

    __slots__ = ("event", "n")

    def __init__(self, n: int) -> None:
        self.n = n
        self.event = asyncio.Event()

    def add(self, n: int) -> None:
        self.n += n
        self.event.set()

    async def take(self) -> None:
        while self.n <= 0:
            self.event.clear()
            await self.event.wait()
        self.n -= 1
