"""A Messages answer streamed as Anthropic's events, in its exact order, written from
the pieces of one choice whatever backend made them (docs/architecture.md, "Anthropic's
Messages API").

The stream: ``message_start`` (the message, empty, ``stop_reason`` null), then per
content block ``content_block_start``, its ``content_block_delta`` events
(``text_delta`` for text, ``input_json_delta`` for a ``tool_use`` block's input as the
model writes it) and ``content_block_stop``; one ``ping`` right after the first block
starts; then ``message_delta`` (``stop_reason``, ``stop_sequence``, the usage, cumulative)
and ``message_stop``. Each event is ``event: <type>`` and its ``data:`` line. A text block
opens when text comes (so an answer that is only a call has no empty text block), a
``tool_use`` block when a call is named; an answer with no content at all is one empty
text block, as the whole answer is.

The first piece is awaited before the first event, so a failure before it is still an
HTTP status in Anthropic's error shape; a failure after it is an ``error`` event, and the
stream ends. The pieces a backend has ready are written as one piece of the response
(one write), not one event at a time; what that costs next to chat's stream:
docs/decisions/0029-messages-stream-level-with-chat.md.
"""

from __future__ import annotations

import os
from collections.abc import AsyncGenerator

import msgspec

from ...errors import ZeroserveError
from ...runtime.channel import PULL_YIELD_EVERY
from ..chat import DeltaPiece, Finish, Output, Piece, QueuedChoice
from ..problems import anthropic_type
from . import schemas as a

_encode = msgspec.json.encode
# A text delta is its event's template around the encoded text (the common event: one
# encode a token, no Struct).
_TEXT_HEAD = b'event: content_block_delta\ndata: {"type":"content_block_delta","index":%d,"delta":{"type":"text_delta","text":'
_TEXT_TAIL = b"}}\n\n"


def new_id(prefix: str) -> str:
    return prefix + os.urandom(12).hex()


def stop_reason(finish: Finish | None, calls: bool) -> a.StopReason:
    """Anthropic's ``stop_reason`` of a finished answer."""
    if calls or (finish is not None and finish.reason == "tool_calls"):
        return "tool_use"
    if finish is None:
        return "end_turn"
    if finish.reason == "length":
        return "max_tokens"
    if finish.stop_sequence is not None:
        return "stop_sequence"
    return "end_turn"


def event(kind: bytes, data: msgspec.Struct) -> bytes:
    """One SSE event as Anthropic writes it: ``event: <type>`` then the data line."""
    return b"event: %s\ndata: %s\n\n" % (kind, _encode(data))


class MessageEvents:
    """The events of one streamed Messages answer."""

    __slots__ = (
        "blocks",
        "calls",
        "ident",
        "model",
        "open",
        "pinged",
        "prompt_tokens",
        "text_head",
    )

    def __init__(self, ident: str, model: str, prompt_tokens: int) -> None:
        self.ident = ident
        self.model = model
        self.prompt_tokens = prompt_tokens  # known up front where the backend counts it
        self.blocks = 0  # blocks started so far (the next block's index)
        self.open: str | None = None  # the open block's type: "text", "tool_use", None
        self.pinged = False
        self.calls = False
        self.text_head = b""

    def _start(self, block: a.TextBlockOut | a.ToolUseOut, kind: str) -> list[bytes]:
        out = self._stop()
        index = self.blocks
        self.blocks += 1
        self.open = kind
        out.append(event(b"content_block_start", a.BlockStart(index, block)))
        if kind == "text":
            self.text_head = _TEXT_HEAD % index
        if not self.pinged:
            self.pinged = True
            out.append(event(b"ping", a.Ping()))
        return out

    def _stop(self) -> list[bytes]:
        if self.open is None:
            return []
        self.open = None
        return [event(b"content_block_stop", a.BlockStop(self.blocks - 1))]

    def _text(self, text: str) -> list[bytes]:
        out = [] if self.open == "text" else self._start(a.TextBlockOut(""), "text")
        out.append(self.text_head + _encode(text) + _TEXT_TAIL)
        return out

    def _piece(self, piece: Piece) -> list[bytes]:
        if type(piece) is str:
            return self._text(piece) if piece else []
        assert isinstance(piece, DeltaPiece)
        out = self._text(piece.text) if piece.text else []
        call = piece.call
        if call is not None:
            if call.id is not None or call.name:
                self.calls = True
                block = a.ToolUseOut(
                    call.id or new_id("toolu_"), call.name or "", msgspec.Raw(b"{}")
                )
                out += self._start(block, "tool_use")
            if call.arguments and self.open == "tool_use":
                delta = a.BlockDelta(self.blocks - 1, a.InputJsonDelta(call.arguments))
                out.append(event(b"content_block_delta", delta))
        return out

    def _message_start(self) -> bytes:
        message = a.AnthropicMessage(
            id=self.ident,
            role="assistant",
            model=self.model,
            content=[],
            stop_reason=None,
            stop_sequence=None,
            usage=a.MessageUsage(input_tokens=self.prompt_tokens, output_tokens=0),
        )
        return event(b"message_start", a.MessageStart(message))

    async def events(self, pending: QueuedChoice) -> AsyncGenerator[bytes, None]:
        """The stream of the one choice ``pending``."""
        output: Output = pending.start()
        try:
            piece = await anext(output, None)  # a failure before it: an HTTP status
            out = [self._message_start()]
            try:
                while piece is not None:
                    out += self._piece(piece)
                    # What is ready now (a batch at most: the writer, and the loop, get
                    # their turn between batches) goes in the same write.
                    for p in output.take_ready(PULL_YIELD_EVERY):
                        out += self._piece(p)
                    yield b"".join(out)
                    out = []
                    piece = await anext(output, None)
            except ZeroserveError as exc:
                # The head is sent: the failure is an ``error`` event, then the end.
                detail = a.ErrorDetail(type=anthropic_type(exc.status), message=str(exc))
                out.append(event(b"error", a.AnthropicError(detail)))
                yield b"".join(out)
                return
        finally:
            await output.aclose()
        finish = output.finish()
        if self.blocks == 0:
            out += self._start(a.TextBlockOut(""), "text")  # an empty answer: one empty text block
        out += self._stop()
        reason = stop_reason(finish, self.calls)
        cached = finish.cached_tokens
        out.append(
            event(
                b"message_delta",
                a.MessageDelta(
                    a.StopDelta(
                        stop_reason=reason,
                        stop_sequence=finish.stop_sequence if reason == "stop_sequence" else None,
                    ),
                    a.DeltaUsage(
                        output_tokens=finish.completion_tokens,
                        input_tokens=finish.prompt_tokens - (cached or 0),
                        cache_read_input_tokens=cached,
                    ),
                ),
            )
        )
        out.append(event(b"message_stop", a.MessageStop()))
        yield b"".join(out)
