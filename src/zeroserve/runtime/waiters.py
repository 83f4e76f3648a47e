"""Tasks waiting for an executor slot (a free worker, a free thread slot), shared by the
inproc, process and Ray executors.

Strategy (docs/architecture.md, "Priority classes";
docs/decisions/0036-priority-classes-with-linear-aging.md)
--------------------------------------------------------------------------------------
Capacity here is whatever the executor says it is (a worker usable and not busy, a
free thread slot, a replica with room), so a waiter is not handed a slot: it is woken
and tries to take one itself with the executor's ``attempt`` (None: nothing for it).

The waits that take capacity (:meth:`Waiters.take`: the model's infer and embed
batchers asking for a slot) are ordered by class with the same aging as the batchers'
queues and the engine slots: they wait in one :class:`~.classes.ClassQueue`, and
``wake_all()`` wakes them best rank first, so they re-try in that order (asyncio runs
woken tasks in the order their futures were resolved) and the best one takes the slot.
While a waiter is queued or a woken round is still re-trying, a newcomer does not try
first: it queues by its rank (so it cannot take a slot that was freed for a better
one), and when the round ends with newcomers queued, they and the rest are woken for
one more round (a newcomer may find capacity the round left).

Waits that take nothing (:meth:`Waiters.wait`: a stream waiting out a restart for any
ready worker) are not ordered: each is woken by every ``wake_all()`` and re-checks.

Invariants
----------
* A waiter that is cancelled leaves no future behind, queued or woken.
* Every ``wake_all()`` wakes every waiter: a capacity change is never lost.
* Only the event-loop thread touches a ``Waiters``.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import TypeVar

from .classes import DEFAULT_AGING_S, ClassQueue, Priority

T = TypeVar("T")


class Waiters:
    """Tasks waiting for capacity: class-ordered :meth:`take`, unordered :meth:`wait`;
    ``wake_all()`` after any capacity change."""

    __slots__ = ("_futs", "_newcomers", "_queue", "_woken")

    def __init__(self, aging_s: float = DEFAULT_AGING_S) -> None:
        self._futs: list[asyncio.Future[None]] = []
        # Ranks come from the arrivals the takers pass (on their batcher's clock); the
        # queue's own clock would only time its statistics, which are not reported.
        self._queue: ClassQueue[asyncio.Future[None]] = ClassQueue(time.monotonic, aging_s)
        self._woken = 0  # woken takers that have not re-tried yet
        self._newcomers = False  # a taker queued during a round without trying

    @property
    def contended(self) -> bool:
        """Whether a taker is queued or re-trying: a newcomer must queue behind the
        ranks (``attempt`` first would jump them)."""
        return bool(self._queue) or self._woken > 0

    def __len__(self) -> int:
        """Takers queued now."""
        return len(self._queue)

    def wake_all(self) -> None:
        futs, self._futs = self._futs, []
        for fut in futs:
            if not fut.done():
                fut.set_result(None)
        queue = self._queue
        if queue:
            for fut in queue.take(len(queue)):  # best rank first: they resume in order
                fut.set_result(None)
                self._woken += 1

    async def wait(self) -> None:
        """Until the next ``wake_all()`` (unordered: for waits that take nothing)."""
        fut = asyncio.get_running_loop().create_future()
        self._futs.append(fut)
        try:
            await fut
        finally:
            if fut in self._futs:
                self._futs.remove(fut)

    async def take(
        self,
        attempt: Callable[[], T | None],
        priority: Priority,
        arrived: float,
    ) -> T:
        """What ``attempt()`` returns once it is not None, trying in class order:
        ``priority`` aged from ``arrived`` (every taker's on one clock: its batcher's).
        ``attempt`` may raise (closing), which ends the wait with its exception."""
        if not self.contended:
            got = attempt()
            if got is not None:
                return got
        elif self._woken:
            self._newcomers = True  # queued mid-round without trying: one more round
        while True:
            fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            self._queue.push(fut, priority, arrived)
            try:
                await fut
            except BaseException:
                if not self._queue.remove(fut):  # woken, then cancelled: its turn passes
                    self._retried()
                raise
            try:
                got = attempt()
            finally:
                self._retried()
            if got is not None:
                return got

    def _retried(self) -> None:
        """A woken taker has re-tried (or given up): when it was the round's last and
        newcomers queued meanwhile, wake everyone queued for one more round."""
        self._woken -= 1
        if self._woken == 0 and self._newcomers:
            self._newcomers = False
            self.wake_all()


class RankedSemaphore:
    """``n`` interchangeable slots taken in class order: an ``asyncio.Semaphore`` whose
    waiters are served by rank, not arrival (the thread and inline executors' slots)."""

    __slots__ = ("_waiters", "free")

    def __init__(self, n: int, aging_s: float = DEFAULT_AGING_S) -> None:
        self.free = n
        self._waiters = Waiters(aging_s)

    def locked(self) -> bool:
        """Whether an acquire now would wait (no slot free, or others ranked first)."""
        return self.free == 0 or self._waiters.contended

    async def acquire(self, priority: Priority, arrived: float) -> None:
        await self._waiters.take(self._take, priority, arrived)

    def release(self) -> None:
        self.free += 1
        self._waiters.wake_all()

    def _take(self) -> bool | None:
        if self.free == 0:
            return None
        self.free -= 1
        return True
