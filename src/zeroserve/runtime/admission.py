"""Admission: refuse work at the request head, before its body is read.

Strategy
--------
* Per model, by queue depth: every admitted request holds a :class:`Ticket` until the
  engine finishes with it (queued + running). At ``depth`` tickets the next ``admit()``
  raises ``Overloaded(429)``.
* Global, by bytes in flight: the arena's budget. ``Arena.allocate`` raises
  ``Overloaded(503)`` itself; :func:`check_bytes` lets the head decide before allocating.
* Admission queues nothing: an admitted request waits in its batcher's queue or for an
  engine slot, both ordered by the ticket's priority class (runtime/classes.py); the
  depth counts every class alike.
* ``Retry-After`` is computed from the measured drain rate: completions per second over
  a sliding window of the injected clock. "You are N behind a queue draining at R/s"
  means "come back in N/R seconds". With no measurement yet, a default is used.

Invariants
----------
* ``in_flight`` equals the number of unreleased tickets. A ticket has one owner at a
  time (the request, then the engine or the stream it returns), and only the owner
  releases it: a second ``release()`` is a bug and fails its assertion.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from ..errors import Overloaded
from .arena import Arena, size_class
from .classes import DEFAULT_PRIORITY, Priority
from .clock import Clock

# Admitted-but-unfinished requests per model. 64 keeps a batching model (batch 16-32)
# fed two batches deep while bounding queueing delay; W7 needs rejections to be fast, not
# queued behind minutes of work.
DEFAULT_QUEUE_DEPTH = 64
# Drain rate is measured over the last 10 s of completions: long enough to smooth one
# slow batch, short enough to follow a change of load.
DRAIN_WINDOW_S = 10.0
# Completions remembered for the drain rate (bounds memory under any load).
DRAIN_SAMPLES = 1024
# Retry-After when nothing has completed yet (cold start, or a stalled model).
DEFAULT_RETRY_AFTER_S = 1.0
# Never ask a client to wait longer than this; past it the estimate is noise.
MAX_RETRY_AFTER_S = 60.0


@dataclass(frozen=True, slots=True)
class AdmissionStatistics:
    depth: int
    in_flight: int
    admitted: int
    rejected: int
    completed: int
    drain_rate: float


class DrainMeter:
    """Completions per second over a sliding window of the injected clock."""

    def __init__(self, clock: Clock, window: float = DRAIN_WINDOW_S) -> None:
        self._clock = clock
        self._window = window
        self._times: deque[float] = deque(maxlen=DRAIN_SAMPLES)

    def record(self) -> None:
        self._times.append(self._clock())

    def rate(self) -> float:
        now = self._clock()
        times = self._times
        while times and now - times[0] > self._window:
            times.popleft()
        if len(times) < 2:
            return 0.0
        span = max(now - times[0], 1e-6)
        return len(times) / span

    def retry_after(self, backlog: int) -> float:
        rate = self.rate()
        if rate <= 0.0:
            return DEFAULT_RETRY_AFTER_S
        return min(MAX_RETRY_AFTER_S, max(backlog, 1) / rate)


class QueueWatch(Protocol):
    """Told when a request's work is handed to its model's queue (``queued``) and when a
    worker or slot starts it (``started``): tracing's queue-wait span
    (docs/architecture.md, "The edge")."""

    def queued(self) -> None: ...

    def started(self) -> None: ...


class Ticket:
    """One admitted request's place in its model's queue. Released exactly once.
    ``watch`` (None unless tracing is on) is told when the work waits and starts;
    ``priority`` is the request's class, which orders its waits (runtime/classes.py)."""

    __slots__ = ("_admission", "admitted_at", "model", "priority", "watch")

    def __init__(
        self,
        admission: Admission,
        model: str,
        admitted_at: float,
        priority: Priority = DEFAULT_PRIORITY,
    ) -> None:
        self._admission: Admission | None = admission
        self.model = model
        self.admitted_at = admitted_at
        self.priority = priority
        self.watch: QueueWatch | None = None

    @property
    def released(self) -> bool:
        return self._admission is None

    def release(self) -> None:
        admission, self._admission = self._admission, None
        assert admission is not None, f"{self!r} released twice"
        admission._release()

    def __repr__(self) -> str:
        return f"<Ticket model={self.model!r} released={self.released}>"


class Admission:
    """Per-model admission by queue depth."""

    def __init__(self, model: str, depth: int, clock: Clock) -> None:
        if depth < 1:
            raise ValueError("queue depth must be at least 1")
        self.model = model
        self.depth = depth
        self._clock = clock
        self.meter = DrainMeter(clock)
        self._in_flight = 0
        self._admitted = 0
        self._rejected = 0
        self._completed = 0
        # Set when the last ticket is released while someone waits to drain.
        self._idle: asyncio.Event | None = None
        # Set when the model is being unloaded: a handle taken before that admits no more.
        self._closed_reason: str | None = None
        # When the last ticket was released (or the admission made): idle since then.
        self._idle_since = clock()
        # Called each time the last ticket is released (the model manager's room waits).
        self.on_idle: Callable[[], None] | None = None

    def close(self, reason: str) -> None:
        """Admit nothing more (503 with ``reason``); tickets held run to their end."""
        self._closed_reason = reason

    def admit(self, priority: Priority = DEFAULT_PRIORITY) -> Ticket:
        """A ticket of class ``priority``, or ``Overloaded(429)`` with ``retry_after``
        from the drain rate (``Overloaded(503)`` once closed). The depth counts every
        class alike: a class orders the waits, it does not reserve room."""
        if self._closed_reason is not None:
            self._rejected += 1
            raise Overloaded(self._closed_reason, status=503, retry_after=DEFAULT_RETRY_AFTER_S)
        if self._in_flight >= self.depth:
            self._rejected += 1
            raise Overloaded(
                f"model {self.model!r} is at its queue depth ({self.depth})",
                status=429,
                retry_after=self.meter.retry_after(self._in_flight),
            )
        self._in_flight += 1
        self._admitted += 1
        return Ticket(self, self.model, self._clock(), priority)

    def _release(self) -> None:
        self._in_flight -= 1
        self._completed += 1
        self.meter.record()
        if self._in_flight == 0:
            self._idle_since = self._clock()
            if self._idle is not None:
                self._idle.set()
            if self.on_idle is not None:
                self.on_idle()

    @property
    def idle_since(self) -> float | None:
        """When the model last held no ticket, on the clock; None while one is held."""
        return None if self._in_flight else self._idle_since

    async def wait_idle(self) -> None:
        """Return once no ticket is held (nothing queued, running or streaming)."""
        while self._in_flight:
            self._idle = asyncio.Event()
            try:
                await self._idle.wait()
            finally:
                self._idle = None

    @property
    def in_flight(self) -> int:
        return self._in_flight

    def statistics(self) -> AdmissionStatistics:
        return AdmissionStatistics(
            depth=self.depth,
            in_flight=self._in_flight,
            admitted=self._admitted,
            rejected=self._rejected,
            completed=self._completed,
            drain_rate=self.meter.rate(),
        )


def check_bytes(arena: Arena, nbytes: int, *, retry_after: float = DEFAULT_RETRY_AFTER_S) -> None:
    """Raise ``Overloaded(503)`` if a lease of ``nbytes`` would not fit the arena budget now.

    A head-of-request decision: the body is refused before a byte of it is read.
    """
    stats = arena.statistics()
    if stats.used + size_class(nbytes) > stats.budget:
        raise Overloaded(
            "server is at its limit of payload bytes in flight",
            status=503,
            retry_after=retry_after,
        )
