"""The runtime's :class:`Stream`: one generation's pieces, read from its channel."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from ..errors import DeadlineExceeded
from .admission import Ticket
from .channel import Channel, ChannelStatistics
from .clock import Timer
from .contract import Producer
from .timing import StreamTiming


class Stream:
    """An async iterator of a generation's pieces (``str``, or bytes-like for raw): a
    :class:`~zeroserve.app.response.PieceStream`. It owns the generation's ticket and
    releases it once, when the stream ends or is closed.

    Iterate it; ``aclose()`` stops the generation early. Errors (the model's, a deadline,
    a worker crash) are raised from the iteration after the pieces before them.
    """

    def __init__(
        self,
        channel: Channel,
        ticket: Ticket,
        on_finish: Callable[[Stream], None],
        timing: StreamTiming,
    ) -> None:
        self._on_finish = on_finish
        self._timing = timing
        self.channel = channel
        self._ticket = ticket
        self._producer: Producer | None = None
        self._timer: Timer | None = None
        self._finished = False

    def __aiter__(self) -> Stream:
        return self

    async def __anext__(self) -> Any:
        try:
            piece = await self.channel.__anext__()
        except StopAsyncIteration:
            self._finish()
            raise
        except asyncio.CancelledError:
            self._abort()
            raise
        except BaseException:
            self._finish()
            raise
        self._timing.awaited()
        return piece

    async def aclose(self) -> None:
        """Stop the generation (the model's generator is closed; a worker is told)."""
        self._abort()

    def receive_batch_nowait(self, max_items: int) -> list[Any]:
        """Up to ``max_items`` pieces available right now, without waiting: what a writer
        sends in one go. The end of the stream or an error is left for ``__anext__``."""
        pieces = self.channel.receive_batch_nowait(max_items)
        self._timing.ready(len(pieces))
        return pieces

    def statistics(self) -> ChannelStatistics:
        return self.channel.statistics()

    @property
    def finish_reason(self) -> str | None:
        """What the model's generator returned (``"stop"`` / ``"length"`` for models that
        say), once the stream has ended; ``None`` if it returned nothing."""
        result = self.channel.result
        return result if isinstance(result, str) else None

    def _expire(self) -> None:
        self.channel.abort(DeadlineExceeded("the request's deadline passed during generation"))
        if self._producer is not None:
            self._producer.abort()

    def _abort(self) -> None:
        if self._finished:
            return
        if self._producer is not None:
            self._producer.abort()
        self.channel.close_receiver()
        self._finish()

    def _finish(self) -> None:
        if self._finished:
            return
        self._finished = True
        self._timing.flush()
        if self._timer is not None:
            self._timer.cancel()
        self._ticket.release()
        self._on_finish(self)
