"""A relayed upstream body, streamed to the client (``Relay.forward``'s stream): each
piece is every upstream read pending, one client write; the exchange's bounded queue
pauses the upstream while the client lags (docs/gateway.md)."""

from __future__ import annotations

from typing import Protocol

from ...edge import EdgeContext
from ...errors import DeadlineExceeded, ZeroserveError
from ...runtime import Ticket
from ...upstream import Exchange, Upstream, UpstreamConnection
from ._deltas import DeltaCounter
from ._strip import UsageChunkFilter
from ._usage import UsageScanner


class RelayCounts(Protocol):
    """What a relayed stream counts on its relay."""

    timeouts: int
    client_disconnects: int

    def count_estimate(self) -> None: ...


class RelayedStream:
    """The stream's pieces: each is every upstream read pending (one client write). A
    :class:`~zeroserve.app.response.PieceStream`; it owns the request's ticket."""

    __slots__ = ("counted", "edge", "events", "ex", "failed", "relay", "ticket", "up", "usage")

    def __init__(
        self,
        relay: RelayCounts,
        up: Upstream,
        ex: Exchange[UpstreamConnection],
        ticket: Ticket | None,
    ) -> None:
        self.relay = relay
        self.up = up
        self.ex = ex
        self.ticket = ticket
        self.failed = False
        # The upstream's usage (or the estimate), read from the pieces when the edge
        # counts tokens.
        self.usage: UsageScanner | DeltaCounter | None = None
        self.edge: EdgeContext | None = None
        self.counted = 0  # the tokens of the usage read so far, counted already
        # Takes out the usage chunk asked for on the client's behalf (None: pass all).
        self.events: UsageChunkFilter | None = None

    def __aiter__(self) -> RelayedStream:
        return self

    async def __anext__(self) -> list[memoryview]:
        while True:
            try:
                batch = await self.ex.next_batch()
            except ZeroserveError as exc:
                self.failed = True
                self.up.record_failure()
                if isinstance(exc, DeadlineExceeded):
                    self.relay.timeouts += 1
                raise
            events = self.events
            if batch is None:
                if events is not None:
                    self.events = None
                    rest = events.flush()  # a last event the upstream left unended
                    if rest:
                        return rest
                raise StopAsyncIteration
            usage = self.usage
            if usage is not None:
                for view in batch:
                    usage.feed(view)
                self._count(usage)
            if events is None:
                return batch
            batch = events.feed(batch)
            if batch:  # else all of it is held, or was the usage chunk: read on
                return batch

    def receive_batch_nowait(self, max_items: int) -> list[list[memoryview]]:
        """Nothing: each piece already holds every read that was pending."""
        return []

    @property
    def finish_reason(self) -> str | None:
        return None  # the upstream's own stream says, in its bytes

    async def aclose(self) -> None:
        """The stream is over: at its end (the connection goes back to the pool), or cut
        short by the client, an error or the deadline (the connection is aborted)."""
        ex = self.ex
        if not ex.finished:
            if not ex.complete and not self.failed:
                self.relay.client_disconnects += 1
            ex.finish(True)
        ticket, self.ticket = self.ticket, None
        if ticket is not None:
            ticket.release()
        usage, self.usage = self.usage, None
        if isinstance(usage, DeltaCounter) and usage.estimated:
            self.relay.count_estimate()

    def _count(self, usage: UsageScanner | DeltaCounter) -> None:
        """Count the usage read so far (the increase of a cumulative one)."""
        tokens = usage.tokens
        if tokens is not None and tokens > self.counted and self.edge is not None:
            self.edge.count_tokens(tokens - self.counted)
            self.counted = tokens
