"""A bounded, single-consumer channel of stream pieces (text or bytes), one per stream.

Strategy
--------
A deque of pending pieces, bounded at ``capacity`` (default 8, the seed's value), with one
of two policies when it is full:

* ``block``: the producer waits in ``send`` (``send_nowait`` raises ``WouldBlock``). For
  producers that serve one request, whose waiting stalls nobody else.
* ``coalesce``: the producer never waits. A piece sent to a full channel is merged into
  the last pending slot (kept as a list of parts, joined once when the consumer takes it,
  so merging is O(1) and not quadratic). A batched engine serving many streams is never
  stalled by one slow client. Past ``byte_cap`` pending bytes the stream is aborted with
  :class:`StreamAborted`: the consumer is too far behind to ever be worth catching up.

Memory held by a stream is therefore bounded by ``capacity`` pieces (block) or by
``byte_cap`` bytes (coalesce); ``statistics()`` reports the peaks so tests can assert it.

Ends of a stream (trio's naming): the producer calls ``close()`` (optionally with an
error the consumer will raise); the consumer calls ``aclose()``, after which the
producer's ``send`` raises ``errors.Broken``. ``abort(error)`` drops everything pending
and delivers ``error`` at once (deadlines, worker death).

A *pulled* channel has no producer task: ``puller`` (set by the inline executor for a
sync generator) is called by the consumer with how many pieces it wants when none is
pending, so the stream holds nothing at all beyond the pieces being sent, and a burst
costs no task switches. The puller makes a whole batch in one call (the inline executor
runs it as C-level ``list(islice(...))`` over the generator), so the fast path of
``receive_batch_nowait`` runs no Python code per piece. ``__anext__`` still yields to the
loop every ``PULL_YIELD_EVERY`` pulled pieces, so a consumer that never suspends cannot
starve the loop either.

Invariants
----------
* Only the event-loop thread touches a channel.
* ``pending_bytes`` counts bytes of bytes-like pieces and characters of text pieces.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from .. import metrics
from ..errors import Broken, Closed, StreamAborted, WouldBlock
from ..models.base import Piece

Policy = Literal["block", "coalesce"]

# The seed's channel size: enough to smooth a consumer's jitter, small enough that a
# stalled client pins only a handful of pieces.
DEFAULT_CAPACITY = 8
# Coalesce: at most 1 MiB of text behind a lagging client. A client that is a whole
# mebibyte behind a token stream (minutes of generation) is not coming back; aborting
# it keeps W5 (RSS growth <= 16 MiB) true even with a dozen such clients.
DEFAULT_COALESCE_CAP_BYTES = 1 << 20

POLICIES: tuple[Policy, ...] = ("block", "coalesce")
# A consumer of a pulled channel gives the loop back at least every 16 pieces (each costs
# microseconds, so a stall stays well under a millisecond).
PULL_YIELD_EVERY = 16


@dataclass(frozen=True, slots=True)
class ChannelStatistics:
    capacity: int
    policy: str
    pending: int
    pending_bytes: int
    peak_pending: int
    peak_pending_bytes: int
    sent: int
    received: int
    coalesced: int
    waiting_senders: int
    closed: bool


def _size(piece: Piece) -> int:
    if isinstance(piece, str):
        return len(piece)
    if isinstance(piece, memoryview):
        return piece.nbytes
    return len(piece)


class _Parts:
    """Pieces merged into one slot while the consumer lags (coalesce)."""

    __slots__ = ("items",)

    def __init__(self, first: Piece) -> None:
        self.items: list[Piece] = [first]

    def join(self) -> Piece:
        items = self.items
        if all(isinstance(p, str) for p in items):
            return "".join(items)  # type: ignore[arg-type]
        parts = [p.encode() if isinstance(p, str) else p for p in items]
        out = b"".join(parts)
        metrics.count_copy("coalesce", len(out))
        return out


class Channel:
    """A bounded stream channel. Iterate it (``async for``) to receive pieces."""

    def __init__(
        self,
        capacity: int = DEFAULT_CAPACITY,
        *,
        policy: Policy = "block",
        byte_cap: int = DEFAULT_COALESCE_CAP_BYTES,
        on_take: Callable[[int], object] | None = None,
    ) -> None:
        if capacity < 1:
            raise ValueError("channel capacity must be at least 1")
        if policy not in POLICIES:
            raise ValueError(f"unknown channel policy {policy!r}; expected one of {POLICIES}")
        self.capacity = capacity
        self.policy: Policy = policy
        self.byte_cap = byte_cap
        # Called with the number of pieces the consumer just took (credits, statistics).
        self.on_take = on_take
        self._items: deque[Piece | _Parts] = deque()
        self._bytes = 0
        self._peak = 0
        self._peak_bytes = 0
        self._sent = 0
        self._received = 0
        self._coalesced = 0
        self._send_closed = False
        self._recv_closed = False
        self._error: BaseException | None = None
        # What the producer returned when it finished (a generator's return value, e.g. a
        # model's finish reason); readable once the consumer has seen the end.
        self.result: Any = None
        self._getter: asyncio.Future[None] | None = None
        self._putters: deque[asyncio.Future[None]] = deque()
        # Pulled channels: ``puller(n)`` returns up to ``n`` new pieces, fewer only after
        # it closed the channel (the generator ended or failed).
        self.puller: Callable[[int], list[Any]] | None = None
        self._pulled = 0

    # -- producer side -------------------------------------------------------------------
    def send_nowait(self, piece: Piece) -> None:
        """Queue ``piece``. Raises ``WouldBlock`` when a ``block`` channel is full,
        ``errors.Broken`` when the consumer went away, ``errors.Closed`` after ``close()``."""
        self._check_open()
        n = _size(piece)
        if len(self._items) < self.capacity:
            self._items.append(piece)
        elif self.policy == "coalesce":
            last = self._items[-1]
            if isinstance(last, _Parts):
                last.items.append(piece)
            else:
                self._items[-1] = _Parts(last)
                self._items[-1].items.append(piece)  # type: ignore[union-attr]
            self._coalesced += 1
        else:
            raise WouldBlock
        self._sent += 1
        self._bytes += n
        if len(self._items) > self._peak:
            self._peak = len(self._items)
        if self._bytes > self._peak_bytes:
            self._peak_bytes = self._bytes
        if self.policy == "coalesce" and self._bytes > self.byte_cap:
            err = StreamAborted(
                f"stream aborted: the client fell more than {self.byte_cap} bytes behind"
            )
            self.abort(err)
            raise err
        self._wake_getter()

    async def send(self, piece: Piece) -> None:
        """Queue ``piece``, waiting for room under the ``block`` policy."""
        while True:
            try:
                self.send_nowait(piece)
                return
            except WouldBlock:
                pass
            await self.wait_writable()

    async def wait_writable(self) -> None:
        """Wait until a piece can be sent without blocking (or the channel ends)."""
        while (
            len(self._items) >= self.capacity
            and self.policy == "block"
            and not (self._recv_closed or self._send_closed)
        ):
            fut = asyncio.get_running_loop().create_future()
            self._putters.append(fut)
            try:
                await fut
            finally:
                if fut in self._putters:
                    self._putters.remove(fut)

    def close(self, error: BaseException | None = None, *, result: Any = None) -> None:
        """Producer end: no more pieces. The consumer drains what is pending, then gets
        ``error`` (if any) or the end of iteration. ``result`` is kept as ``self.result``."""
        if self._send_closed:
            return
        self._send_closed = True
        # The producer's hooks usually hold this channel (a closure over it): dropped once
        # they are of no more use, so refcounting frees both, not the cyclic GC.
        self.puller = self.on_take = None
        self.result = result
        if error is not None and self._error is None:
            self._error = error
        self._wake_getter()
        self._wake_putters()

    def abort(self, error: BaseException) -> None:
        """Drop everything pending; the consumer gets ``error`` on its next receive."""
        self._items.clear()
        self._bytes = 0
        self._error = error
        self._send_closed = True
        self.puller = self.on_take = None
        self._wake_getter()
        self._wake_putters()

    @property
    def consumer_closed(self) -> bool:
        return self._recv_closed

    @property
    def closed(self) -> bool:
        return self._send_closed or self._recv_closed

    # -- consumer side -------------------------------------------------------------------
    def __aiter__(self) -> Channel:
        return self

    def receive_nowait(self) -> Piece:
        """Take the next piece. ``WouldBlock`` if none is pending yet; ``StopAsyncIteration``
        at the end of the stream; the producer's error if it closed with one."""
        if self._items:
            item = self._items.popleft()
            if isinstance(item, _Parts):
                size, taken = sum(_size(p) for p in item.items), len(item.items)
                piece = item.join()
            else:
                size, taken, piece = _size(item), 1, item
            self._bytes -= size
            self._received += taken
            self._wake_putter()
            if self.on_take is not None:
                self.on_take(taken)
            return piece
        if self._recv_closed:
            raise StopAsyncIteration
        if self._send_closed:
            if self._error is not None:
                err, self._error = self._error, None
                self._recv_closed = True
                raise err
            raise StopAsyncIteration
        raise WouldBlock

    def _pull(self) -> None:
        """Have the puller make the next piece (queued), or close the channel."""
        puller = self.puller
        if puller is None or self._send_closed or self._recv_closed:
            return
        self._pulled += 1
        for piece in puller(1):
            self._items.append(piece)
            self._sent += 1
            self._bytes += _size(piece)
            if self._peak == 0:
                self._peak = 1

    def receive_batch_nowait(self, max_items: int) -> list[Piece]:
        """Up to ``max_items`` pieces that are ready now (pulling them if pulled). Stops
        short of the end of the stream or an error, which ``__anext__`` then reports."""
        out: list[Piece] = []
        while self._items and len(out) < max_items:
            out.append(self.receive_nowait())
        puller = self.puller
        if puller is None or len(out) >= max_items or self._send_closed or self._recv_closed:
            return out
        # Pulled: the generator makes the batch directly, nothing is queued (the hot path
        # of a stream from a sync inline model, e.g. echo: one call per batch).
        pulled = puller(max_items - len(out))
        n = len(pulled)
        out += pulled
        self._pulled += n
        self._sent += n
        self._received += n
        if n and self.on_take is not None:
            self.on_take(n)
        return out

    async def __anext__(self) -> Piece:
        while True:
            if not self._items and self.puller is not None:
                if self._pulled and self._pulled % PULL_YIELD_EVERY == 0:
                    self._pulled += 1
                    await asyncio.sleep(0)
                self._pull()
            try:
                return self.receive_nowait()
            except WouldBlock:
                pass
            fut = asyncio.get_running_loop().create_future()
            self._getter = fut
            try:
                await fut
            finally:
                self._getter = None

    async def aclose(self) -> None:
        """Consumer end: discard what is pending; the producer's next ``send`` raises
        ``errors.Broken``."""
        self.close_receiver()

    def close_receiver(self) -> None:
        """``aclose()`` for callers that cannot await (cancellation paths)."""
        self._recv_closed = True
        self.puller = self.on_take = None
        self._items.clear()
        self._bytes = 0
        self._wake_putters()
        self._wake_getter()

    # -- helpers ---------------------------------------------------------------------------
    def _check_open(self) -> None:
        if self._recv_closed:
            raise Broken("the stream's consumer went away")
        if self._send_closed:
            if self._error is not None:
                raise self._error
            raise Closed("send on a closed channel")

    def _wake_getter(self) -> None:
        fut = self._getter
        if fut is not None and not fut.done():
            fut.set_result(None)

    def _wake_putter(self) -> None:
        while self._putters:
            fut = self._putters.popleft()
            if not fut.done():
                fut.set_result(None)
                return

    def _wake_putters(self) -> None:
        while self._putters:
            fut = self._putters.popleft()
            if not fut.done():
                fut.set_result(None)

    def statistics(self) -> ChannelStatistics:
        return ChannelStatistics(
            capacity=self.capacity,
            policy=self.policy,
            pending=len(self._items),
            pending_bytes=self._bytes,
            peak_pending=self._peak,
            peak_pending_bytes=self._peak_bytes,
            sent=self._sent,
            received=self._received,
            coalesced=self._coalesced,
            waiting_senders=len(self._putters),
            closed=self.closed,
        )
