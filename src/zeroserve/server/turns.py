"""Turns: how the streams of one server share each event-loop iteration.

Strategy
--------
The loop polls for I/O (new connections, new request heads) once per iteration, after it
has run everything that was ready. Without a bound, every running stream writes a batch
in every iteration, so the time between two polls grows with the number of streams and
a new client's first event waits two or three of those iterations
(docs/decisions/0003-stream-turn-budget.md).

``Turns`` bounds the stream work of one iteration (one *turn*): each writer measures its
batches (``charge``) and, before its next batch, asks ``over()``; while the turn's work
is past ``budget_s``, it queues (``wait``, FIFO) instead of writing. The first charge of
a turn schedules the next turn (``call_soon``: it runs after the next poll), which wakes
as many waiting writers as the budget fits, at least one, judged by the average batch.
A writer waits once per deferred batch (one future), never spins, and batches keep their
size, so the CPU per stream is unchanged; a new stream's first batch
(``StreamWriter.start``, from the I/O callback) is never deferred, only charged. Waiting
writers are woken even when no one charges, so a queue never stalls.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Callable

# How much of the average batch's cost the next sample moves it (an exponential average
# over about this many batches).
_AVERAGE_OVER = 8


class Turns:
    """The loop-wide turn of the streams of one server."""

    __slots__ = ("_average", "_scheduled", "_waiting", "budget_s", "clock", "loop", "spent")

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        budget_s: float,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        self.loop = loop
        self.budget_s = budget_s
        self.clock = clock  # what ``charge`` is measured with
        self.spent = 0.0  # seconds of stream work in this turn
        self._average = 0.0  # seconds of an average batch
        self._waiting: deque[asyncio.Future[None]] = deque()
        self._scheduled = False

    def over(self) -> bool:
        """This turn's work is spent: a batch now should ``wait`` for a later turn."""
        return self.spent > self.budget_s or bool(self._waiting)

    def charge(self, seconds: float) -> None:
        """A batch took ``seconds`` of this turn."""
        self.spent += seconds
        self._average += (seconds - self._average) / _AVERAGE_OVER
        self._schedule()

    async def wait(self) -> None:
        """Until a later turn lets this writer go (first come, first served)."""
        fut: asyncio.Future[None] = self.loop.create_future()
        self._waiting.append(fut)
        self._schedule()
        await fut  # cancelled (the client left): the turn skips it

    @property
    def waiting(self) -> int:
        return len(self._waiting)

    def _schedule(self) -> None:
        if not self._scheduled:
            self._scheduled = True
            self.loop.call_soon(self._turn)

    def _turn(self) -> None:
        self._scheduled = False
        self.spent = 0.0
        waiting = self._waiting
        if not waiting:
            return
        average = self._average
        room = max(1, int(self.budget_s / average)) if average > 0 else len(waiting)
        while waiting and room:
            fut = waiting.popleft()
            if not fut.done():
                fut.set_result(None)
                room -= 1
        if waiting:
            self._schedule()
