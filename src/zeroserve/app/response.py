"""Response types the app hands to the server. Bodies are buffer lists, never joined.

A handler returns a :data:`HandlerResult`: a :class:`Response` (answered on the spot), a
:class:`StreamResponse` (its head waits for the first piece), or an awaitable of either
(run as a task). The pieces of a stream are a :class:`PieceStream` (docs/architecture.md,
"Stream classes").
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, Awaitable, Callable, Sequence
from typing import Any, Literal, Protocol

import msgspec

Buffer = bytes | bytearray | memoryview
Headers = list[tuple[bytes, bytes]]

JSON = b"application/json"
TEXT = b"text/plain; charset=utf-8"
OCTET = b"application/octet-stream"
EVENT_STREAM = b"text/event-stream"

_json_encoder = msgspec.json.Encoder()


class Response:
    """A complete response. ``body`` buffers go to ``writelines`` as they are; ``release``
    callbacks run once the transport has sent them (e.g. returning arena leases)."""

    __slots__ = ("body", "headers", "release", "status")

    def __init__(
        self,
        status: int = 200,
        body: Sequence[Buffer] = (),
        *,
        content_type: bytes | None = None,
        headers: Headers | None = None,
        release: Sequence[Callable[[], None]] = (),
    ) -> None:
        self.status = status
        self.body = body
        self.headers: Headers = headers if headers is not None else []
        if content_type is not None:
            self.headers.append((b"content-type", content_type))
        self.release = release


class PieceStream(Protocol):
    """What the server iterates to write a stream. A piece is a buffer, a ``str``, or a
    list of them (sent as one write). Implemented by the runtime's ``Stream``, the OpenAI
    ``ChoiceStream`` and the gateway's relayed stream."""

    def __anext__(self) -> Awaitable[Any]:
        """The next piece (waits); ``StopAsyncIteration`` at the end; errors after the
        pieces before them."""
        ...

    def receive_batch_nowait(self, max_items: int) -> list[Any]:
        """Up to ``max_items`` pieces that are ready now, without waiting (possibly none);
        the end of the stream and errors are left for ``__anext__``."""
        ...

    async def aclose(self) -> None:
        """Stop early, or clean up after the end; releases what the stream owns. The
        server awaits it exactly once, however the stream ended."""
        ...

    @property
    def finish_reason(self) -> str | None:
        """Why the stream ended, once it has, if its producer said; else ``None``."""
        ...


class StreamResponse:
    """A streamed response. ``pieces`` yields buffers (or lists of buffers, sent as one
    write); ``framing`` is ``"chunked"`` (raw pieces) or ``"sse"`` (one ``data:`` event
    per piece; the piece must not contain the event terminator). ``pieces.aclose()`` is
    awaited when the stream ends for any reason, including a client disconnect.
    ``counts_pieces``: each piece is one of the model's tokens (the raw API's streams,
    which ``max_tokens`` bounds by pieces), so the edge counts the pieces sent as tokens
    (a key's tokens-per-minute, the access log); other streams count their own tokens."""

    __slots__ = ("counts_pieces", "framing", "headers", "pieces", "status")

    def __init__(
        self,
        pieces: PieceStream,
        *,
        framing: Literal["chunked", "sse"] = "chunked",
        status: int = 200,
        content_type: bytes | None = None,
        headers: Headers | None = None,
        counts_pieces: bool = False,
    ) -> None:
        self.pieces = pieces
        self.counts_pieces = counts_pieces
        self.framing = framing
        self.status = status
        self.headers: Headers = headers if headers is not None else []
        ct = content_type or (EVENT_STREAM if framing == "sse" else OCTET)
        self.headers.append((b"content-type", ct))
        if framing == "sse":
            self.headers.append((b"cache-control", b"no-cache"))


# What every handler returns (docs/architecture.md, "Adding an endpoint").
HandlerResult = Response | StreamResponse | Awaitable[Response | StreamResponse]


def json_response(obj: Any, status: int = 200, headers: Headers | None = None) -> Response:
    return Response(status, [_json_encoder.encode(obj)], content_type=JSON, headers=headers)


def text_response(text: str | bytes, status: int = 200, content_type: bytes = TEXT) -> Response:
    data = text.encode() if isinstance(text, str) else text
    return Response(status, [data], content_type=content_type)


class GeneratedStream:
    """A ``PieceStream`` over an async generator of pieces, with what to release at its
    end however it ends (what it owns that the generator does not close itself)."""

    __slots__ = ("_gen", "_on_close")

    def __init__(self, gen: AsyncGenerator[Any, None], on_close: Callable[[], None]) -> None:
        self._gen = gen
        self._on_close = on_close

    def __anext__(self) -> Awaitable[Any]:
        return self._gen.__anext__()

    def receive_batch_nowait(self, max_items: int) -> list[Any]:
        return []  # every piece is made by the generator, one at a time

    async def aclose(self) -> None:
        try:
            await self._gen.aclose()
        finally:
            self._on_close()

    @property
    def finish_reason(self) -> str | None:
        return None
