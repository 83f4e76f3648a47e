"""Write flow control of one connection: pause, resume, drain, and release after drain.

Strategy
--------
The transport calls ``pause_writing`` above its high-water mark and ``resume_writing``
once its buffer is below the low one (``WRITE_LOW_WATER`` is 0: empty). The stream
writer awaits ``drain()`` while paused: that is the backpressure its producer feels.

Buffers handed to ``writelines`` may be views of arena leases, so a lease is released
only once the transport has sent everything: ``release_after_drain`` queues the release
callbacks; if bytes remain queued, the high-water mark is dropped to zero, which makes
the transport call ``pause_writing`` now and ``resume_writing`` when it is empty, and
the callbacks run then (or when the connection is lost).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable

from .options import WRITE_HIGH_WATER, WRITE_LOW_WATER

log = logging.getLogger("zeroserve.server")


class WriteFlow:
    """Flow-control state of one connection (``closed`` is the connection's own flag)."""

    __slots__ = (
        "_flush_mode",
        "_loop",
        "_pending",
        "_waiter",
        "closed",
        "paused",
        "paused_since",
        "transport",
    )

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self.paused = False
        self.paused_since = 0.0
        self._waiter: asyncio.Future[None] | None = None
        self._pending: list[Callable[[], None]] = []
        self._flush_mode = False

    def attach(self, transport: asyncio.Transport) -> None:
        self.transport = transport
        transport.set_write_buffer_limits(high=WRITE_HIGH_WATER, low=WRITE_LOW_WATER)

    # -- transport callbacks ------------------------------------------------------------
    def pause(self) -> None:
        self.paused = True
        self.paused_since = self._loop.time()

    def resume(self) -> None:
        self.paused = False
        if self._flush_mode:
            self._flush_mode = False
            assert self.transport is not None
            self.transport.set_write_buffer_limits(high=WRITE_HIGH_WATER, low=WRITE_LOW_WATER)
        self.run_releases()
        self._wake(None)

    def lost(self) -> None:
        """The connection is gone: release everything, fail a waiting writer."""
        self.closed = True
        self.run_releases()
        self._wake(ConnectionResetError("client disconnected"))

    # -- releases -----------------------------------------------------------------------
    def release_after_drain(self, callbacks: Iterable[Callable[[], None]]) -> None:
        self._pending.extend(callbacks)

    def release_one_after_drain(self, callback: Callable[[], None]) -> None:
        self._pending.append(callback)

    def schedule_releases(self) -> None:
        """Run the queued releases now if nothing is queued in the transport, else once
        it is empty."""
        if not self._pending:
            return
        transport = self.transport
        if transport is None or self.closed or transport.get_write_buffer_size() == 0:
            self.run_releases()
            return
        if not self.paused and not self._flush_mode:
            # Ask the transport to tell us when it is empty: pause now, resume at zero.
            self._flush_mode = True
            transport.set_write_buffer_limits(high=0, low=0)

    def run_releases(self) -> None:
        pending, self._pending = self._pending, []
        for release in pending:
            try:
                release()
            except Exception:
                log.exception("release callback failed")

    # -- drain --------------------------------------------------------------------------
    async def drain(self) -> None:
        if self.closed:
            raise ConnectionResetError("client disconnected")
        if not self.paused:
            return
        waiter = self._waiter
        if waiter is None:
            waiter = self._waiter = self._loop.create_future()
        await waiter

    def _wake(self, exc: Exception | None) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            self._waiter = None
            if exc is None:
                waiter.set_result(None)
            else:
                waiter.set_exception(exc)
