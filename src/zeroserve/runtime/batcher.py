"""The dynamic batcher: one per model and capability, between admission and the executor.

Strategy
--------
A single task per batcher loops: (1) wait for a first live request, (2) acquire an
executor slot (a free worker; slots are shared by the model's infer and embed batchers),
(3) wait until ``max_batch_size`` live requests are queued or ``max_batch_delay`` has
passed since the first one arrived (a timer on the injected clock), (4) take the batch
and hand it to ``run`` in its own task; the slot is freed when that task ends.

The batch is formed only *after* a slot is free: while every worker is busy, requests
stay in the queue, where they can still be cancelled or expire cheaply, and the next
batch is formed from everything that accumulated (bigger batches under load).

The queue is a :class:`~.classes.ClassQueue`: a batch takes the best-ranked requests
(their class, aged by their wait: runtime/classes.py), and the batching delay runs from
the arrival of the longest-waiting one, whatever its class.

A request (:class:`Pending`) is "done" as soon as its future is: cancelled by its caller
(client disconnect), failed by its deadline timer, or resolved. Done requests are dropped
at formation, so a cancelled or expired request never runs. While a batch runs, if every
request in it is done, the batch task is cancelled (the executor tells the worker to
abort).

Invariants
----------
* Only the event-loop thread touches a batcher.
* A pending request is in at most one of: the queue, one running batch.
* With a ``ManualClock`` nothing here waits on real time.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from ..errors import DeadlineExceeded
from .admission import QueueWatch
from .classes import DEFAULT_AGING_S, DEFAULT_PRIORITY, ClassQueue, ClassStatistics, Priority
from .clock import Clock, Timer, call_at

S = TypeVar("S")


class Pending:
    """One request waiting for (or in) a batch."""

    __slots__ = ("arrived", "deadline", "future", "payload", "priority", "watch")

    def __init__(
        self,
        payload: Any,
        deadline: float,
        arrived: float,
        watch: QueueWatch | None = None,
        priority: Priority = DEFAULT_PRIORITY,
    ) -> None:
        self.payload = payload
        self.deadline = deadline
        self.arrived = arrived
        self.watch = watch  # told when a slot starts this request (tracing)
        self.priority = priority  # its class: the queue's order (runtime/classes.py)
        self.future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()

    @property
    def done(self) -> bool:
        return self.future.done()

    def fail(self, exc: BaseException) -> None:
        if not self.future.done():
            self.future.set_exception(exc)

    def resolve(self, value: Any) -> bool:
        if self.future.done():
            return False
        self.future.set_result(value)
        return True


@dataclass(frozen=True, slots=True)
class BatcherStatistics:
    queued: int
    running_batches: int
    batches: int
    batched_requests: int
    last_batch_size: int
    max_batch_size: int
    expired: int
    dropped: int


class Batcher(Generic[S]):
    """Forms batches of :class:`Pending` requests and runs them on executor slots.

    ``acquire(priority, arrived)`` waits for a free slot, ranked by the best queued request
    (runtime/waiters.py); ``run(slot, batch)`` executes the batch and resolves
    its requests; the batcher calls ``release(slot)`` when the run ends (even cancelled).
    """

    def __init__(
        self,
        *,
        max_batch_size: int,
        max_delay_s: float,
        clock: Clock,
        acquire: Callable[[Priority, float], Awaitable[S]],
        release: Callable[[S], None],
        run: Callable[[S, list[Pending]], Coroutine[Any, Any, None]],
        name: str = "",
        aging_s: float = DEFAULT_AGING_S,
    ) -> None:
        if max_batch_size < 1:
            raise ValueError("max_batch_size must be at least 1")
        self.name = name
        self.max_batch_size = max_batch_size
        self.max_delay_s = max(0.0, max_delay_s)
        self._clock = clock
        self._acquire = acquire
        self._release = release
        self._run = run
        self._queue: ClassQueue[Pending] = ClassQueue(clock, aging_s)
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._running: set[asyncio.Task[None]] = set()
        self._batches = 0
        self._batched = 0
        self._last = 0
        self._expired = 0
        self._dropped = 0

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(
                self._loop(), name=f"zeroserve-batcher-{self.name}"
            )

    async def aclose(self) -> None:
        tasks = [t for t in (self._task, *self._running) if t is not None]
        for t in tasks:
            t.cancel()
        for t in tasks:
            try:
                await t
            except BaseException:
                pass
        for p in self._queue.clear():
            p.fail(asyncio.CancelledError())

    def submit(self, pending: Pending) -> None:
        self._queue.push(pending, pending.priority, pending.arrived)
        self._wake.set()

    def discard(self, pending: Pending) -> None:
        """Remove a request from the queue if it is still there (cancellation)."""
        if self._queue.remove(pending):
            self._dropped += 1

    def is_queued(self, pending: Pending) -> bool:
        return pending in self._queue

    def class_statistics(self) -> dict[Priority, ClassStatistics]:
        """The queue's waits per class (runtime/classes.py)."""
        return self._queue.statistics()

    @property
    def queued(self) -> int:
        return len(self._queue)

    def wake(self) -> None:
        """Re-examine the queue now (a deadline fired, a clock moved)."""
        self._wake.set()

    # -- the loop ------------------------------------------------------------------------
    def _prune(self) -> int:
        """Drop done and expired requests; return how many live ones remain."""
        now = self._clock()

        def gone(p: Pending) -> bool:
            if p.done:
                self._dropped += 1
                return True
            if now >= p.deadline:
                self._expired += 1
                p.fail(DeadlineExceeded("the request's deadline passed while it was queued"))
                return True
            return False

        queue = self._queue
        queue.remove_if(gone)
        return len(queue)

    async def _wait(self, timer_at: float | None) -> None:
        self._wake.clear()
        timer: Timer | None = None
        if timer_at is not None:
            timer = call_at(self._clock, timer_at, self._wake.set)
        try:
            await self._wake.wait()
        finally:
            if timer is not None:
                timer.cancel()

    async def _collect(self) -> list[Pending]:
        while True:
            n = self._prune()
            if n == 0:
                await self._wait(None)
                continue
            if n >= self.max_batch_size or self.max_batch_size == 1:
                break
            due = self._queue.oldest_arrival() + self.max_delay_s
            if self._clock() >= due:
                break
            await self._wait(due)
        return self._queue.take(self.max_batch_size)

    async def _loop(self) -> None:
        while True:
            while self._prune() == 0:
                await self._wait(None)
            head = self._queue.peek()  # the slot wait is by its best request's class
            slot = await self._acquire(head.priority, head.arrived)
            try:
                if self._prune() == 0:  # all cancelled or expired while we waited
                    self._release(slot)
                    continue
                batch = await self._collect()
            except BaseException:
                self._release(slot)
                raise
            self._batches += 1
            self._batched += len(batch)
            self._last = len(batch)
            task = asyncio.get_running_loop().create_task(self._guard(slot, batch))
            self._running.add(task)
            task.add_done_callback(self._running.discard)

    async def _guard(self, slot: S, batch: list[Pending]) -> None:
        """Run a batch; cancel it if every request in it is done before it finishes."""
        loop = asyncio.get_running_loop()
        run = loop.create_task(self._run(slot, batch))
        remaining = [len(batch)]

        def one_done(_: object) -> None:
            remaining[0] -= 1
            if remaining[0] == 0 and not run.done():
                run.cancel()

        for p in batch:
            p.future.add_done_callback(one_done)
        try:
            await asyncio.wait({run})
            if not run.cancelled() and run.exception() is not None:
                exc = run.exception()
                assert exc is not None
                for p in batch:  # the executor failed the whole batch
                    p.fail(exc)
        except asyncio.CancelledError:
            run.cancel()
            raise
        finally:
            for p in batch:
                p.future.remove_done_callback(one_done)
            self._release(slot)

    def statistics(self) -> BatcherStatistics:
        return BatcherStatistics(
            queued=len(self._queue),
            running_batches=len(self._running),
            batches=self._batches,
            batched_requests=self._batched,
            last_batch_size=self._last,
            max_batch_size=self.max_batch_size,
            expired=self._expired,
            dropped=self._dropped,
        )
