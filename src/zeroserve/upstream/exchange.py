"""One request/response exchange on an upstream connection, and its bounded body queue.

Strategy
--------
The connection's ``data_received`` pushes body views into the exchange; the client
writer pulls them with ``next_batch()``, which returns *every* pending view as one list
(one write, one chunk on the client side: the coalescing). The queue is bounded in
bytes: past ``high_water`` the upstream transport stops reading (``pause_reading``),
so TCP pushes back on the upstream and the relay never holds more than ``high_water``
plus one transport read (at most 256 KiB on asyncio and uvloop) for a client that lags.
Reading resumes when the writer has taken the queue.

Invariants
----------
* ``head`` resolves exactly once: with the head, or with the error that ended the
  exchange first (refused, reset, timeout).
* Errors after the head are raised from ``next_batch()`` after the views before them.
* ``on_finish`` runs exactly once, whatever ends the exchange (end, error, abort).
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable
from typing import Any, Generic, Protocol, TypeVar

from ..errors import ZeroserveError
from ..http.client import ResponseHead


class FlowControlled(Protocol):
    """What an exchange needs of its connection (``pool.UpstreamConnection``): to stop
    and restart reading while its body queue is over the high-water mark."""

    def pause_reading(self) -> None: ...

    def resume_reading(self) -> None: ...


C = TypeVar("C", bound=FlowControlled)


class Exchange(Generic[C]):
    __slots__ = (
        "_done",
        "_error",
        "_paused",
        "_pending",
        "_waiter",
        "batches",
        "bytes_in",
        "coalesced",
        "conn",
        "finished",
        "head",
        "high_water",
        "on_finish",
        "pauses",
        "peak_pending_bytes",
        "pending_bytes",
        "timers",
    )

    def __init__(
        self,
        conn: C,
        high_water: int,
        on_finish: Callable[[Exchange[C], bool], None],
    ) -> None:
        self.conn = conn
        self.high_water = high_water
        self.on_finish = on_finish
        self.head: asyncio.Future[ResponseHead] = asyncio.get_running_loop().create_future()
        self._pending: deque[memoryview] = deque()
        self._waiter: asyncio.Future[None] | None = None
        self._done = False  # the upstream sent the whole response
        self._error: BaseException | None = None
        self._paused = False
        self.finished = False
        self.bytes_in = 0
        self.pending_bytes = 0
        self.peak_pending_bytes = 0
        self.pauses = 0  # times reading the upstream paused for a slow client
        self.batches = 0
        self.coalesced = 0  # batches of more than one upstream read
        self.timers: list[asyncio.TimerHandle] = []

    # -- from the connection ----------------------------------------------------------------
    def on_head(self, head: ResponseHead) -> None:
        if not self.head.done():
            self.head.set_result(head)

    def on_data(self, views: list[memoryview]) -> None:
        n = 0
        for v in views:
            n += v.nbytes
        if not n:
            return
        self._pending.extend(views)
        self.bytes_in += n
        self.pending_bytes += n
        if self.pending_bytes > self.peak_pending_bytes:
            self.peak_pending_bytes = self.pending_bytes
        if self.pending_bytes >= self.high_water and not self._paused:
            self._paused = True
            self.pauses += 1
            self.conn.pause_reading()
        self._wake()

    def on_end(self) -> None:
        self._done = True
        self._cancel_timers()
        self._wake()

    def fail(self, exc: BaseException) -> None:
        """End the exchange with ``exc`` (the connection is closed by the caller)."""
        if self._done or self._error is not None:
            return
        self._error = exc
        self._cancel_timers()
        if not self.head.done():
            self.head.set_exception(exc)
            self.head.exception()  # retrieved: a failure before anyone awaits is fine
        self._wake()

    # -- for the relay ----------------------------------------------------------------------
    @property
    def complete(self) -> bool:
        return self._done

    async def next_batch(self) -> list[memoryview] | None:
        """Every pending body view (one client write), or None at the end of the body.
        Raises the error that cut the body short."""
        while not self._pending:
            if self._error is not None:
                raise self._error
            if self._done:
                return None
            waiter = self._waiter = asyncio.get_running_loop().create_future()
            try:
                await waiter
            finally:
                self._waiter = None
        batch = list(self._pending)
        self._pending.clear()
        self.pending_bytes = 0
        self.batches += 1
        if len(batch) > 1:
            self.coalesced += 1
        if self._paused:
            self._paused = False
            self.conn.resume_reading()
        return batch

    def finish(self, ok: bool) -> None:
        """Hand the connection back (``ok`` and the response complete) or close it."""
        if self.finished:
            return
        self.finished = True
        self._cancel_timers()
        if not self._done and self._error is None:
            self._error = ZeroserveError("exchange closed")
        self._pending.clear()
        self.pending_bytes = 0
        self.on_finish(self, ok and self._done)

    def _cancel_timers(self) -> None:
        for t in self.timers:
            t.cancel()
        self.timers.clear()

    def _wake(self) -> None:
        w = self._waiter
        if w is not None and not w.done():
            w.set_result(None)

    def __repr__(self) -> str:
        state: Any = "done" if self._done else self._error or "open"
        return f"<Exchange {state} in={self.bytes_in}>"
