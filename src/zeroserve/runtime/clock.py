"""Injected time: the batcher, admission and deadlines read a clock and set timers on it.

Strategy
--------
A clock is any zero-argument callable returning seconds (``time.monotonic`` in
production). Timers go through :func:`call_at`: on a real clock they become event-loop
timers (``loop.call_later(when - clock())``); on a :class:`ManualClock` they wait in the
clock's own heap and fire, in order, when a test calls :meth:`ManualClock.advance`. So
tests never sleep and never depend on the machine's speed (trio's ``MockClock``).

Invariants
----------
* Timer callbacks always run on the event-loop thread: real timers are loop timers, and
  manual timers fire inside ``advance()``, which tests call from the loop.
* A timer due at or before "now" when scheduled still fires asynchronously (next loop
  iteration), never re-entrantly inside ``call_at``.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
from collections.abc import Callable
from typing import Protocol

Clock = Callable[[], float]


class Timer(Protocol):
    def cancel(self) -> None: ...


class _ManualTimer:
    __slots__ = ("callback", "cancelled", "when")

    def __init__(self, when: float, callback: Callable[[], object]) -> None:
        self.when = when
        self.callback = callback
        self.cancelled = False

    def cancel(self) -> None:
        self.cancelled = True


class ManualClock:
    """A clock that moves only when told to. Timers set on it fire in ``advance()``."""

    def __init__(self, start: float = 1000.0) -> None:
        self._now = start
        self._heap: list[tuple[float, int, _ManualTimer]] = []
        self._seq = itertools.count()

    def __call__(self) -> float:
        return self._now

    def advance(self, seconds: float) -> None:
        """Move time forward and run, in order, every timer now due."""
        if seconds < 0:
            raise ValueError("time only moves forward")
        self._now += seconds
        while self._heap and self._heap[0][0] <= self._now:
            _, _, timer = heapq.heappop(self._heap)
            if not timer.cancelled:
                timer.callback()

    @property
    def pending_timers(self) -> int:
        return sum(1 for _, _, t in self._heap if not t.cancelled)

    def _schedule(self, when: float, callback: Callable[[], object]) -> Timer:
        timer = _ManualTimer(when, callback)
        if when <= self._now:
            asyncio.get_running_loop().call_soon(_fire, timer)
        else:
            heapq.heappush(self._heap, (when, next(self._seq), timer))
        return timer


def _fire(timer: _ManualTimer) -> None:
    if not timer.cancelled:
        timer.callback()


def call_at(clock: Clock, when: float, callback: Callable[[], object]) -> Timer:
    """Run ``callback`` on the loop once ``clock()`` reaches ``when``."""
    if isinstance(clock, ManualClock):
        return clock._schedule(when, callback)
    loop = asyncio.get_running_loop()
    return loop.call_later(max(0.0, when - clock()), callback)
