"""Anthropic's Messages API shapes (``/v1/messages``, ``/v1/messages/count_tokens``):
the request as decoded at the boundary, the ``message`` answer and the stream's events
(docs/architecture.md, "Anthropic's Messages API"). Only Anthropic's shapes live here;
the translation into the one chat request is ``messages.py``, the events' order
``events.py``.

Requests are strict (an unknown field is a 400 naming it). A content block is one
Struct with every block type's fields, checked per ``type`` by the translation, so a
400 names the block and its type in words rather than msgspec's union message; a tool
is kept raw until its ``type`` is read (a server tool is refused by its type). An image
block's ``source`` stays raw until the block is read (:class:`ImageSource`), and its
base64 ``data`` stays raw after: a view of the body (app/chat/images.py).
"""

from __future__ import annotations

from typing import Annotated, Literal

import msgspec
from msgspec import UNSET, Meta, Struct, UnsetType

from .. import limits as lim
from ..keep_alive import KeepAlive

MaxTokens = Annotated[int, Meta(ge=1, le=lim.MAX_TOKENS)]
# Anthropic's ranges: temperature 0-1, top_p 0-1, top_k a count of tokens.
Temperature = Annotated[float, Meta(ge=0.0, le=1.0)]
TopP = Annotated[float, Meta(ge=0.0, le=1.0)]
TopK = Annotated[int, Meta(ge=0, le=1 << 20)]


# -- the request ---------------------------------------------------------------------------
class CacheControl(Struct, kw_only=True, forbid_unknown_fields=True):
    """A prompt-cache breakpoint. Accepted: llama.cpp's engine keeps every slot's prompt
    prefix cached whatever the request says, and the answer is the same either way."""

    type: Literal["ephemeral"]
    ttl: Literal["5m", "1h"] | None = None


class SystemBlock(Struct, kw_only=True, forbid_unknown_fields=True):
    type: Literal["text"]
    text: str
    cache_control: CacheControl | None = None


class ResultPart(Struct, kw_only=True, forbid_unknown_fields=True):
    """A part of a ``tool_result``'s content (text is served; an image is refused)."""

    type: str
    text: str | None = None
    source: msgspec.Raw | UnsetType = UNSET
    cache_control: CacheControl | None = None


class Block(Struct, kw_only=True, forbid_unknown_fields=True):
    """A content block of any served type: ``text`` (``text``), ``image`` (``source``),
    ``tool_use`` (``id``, ``name``, ``input``), ``tool_result`` (``tool_use_id``,
    ``content``, ``is_error``)."""

    type: str
    text: str | None = None
    source: msgspec.Raw | UnsetType = UNSET
    id: str | None = None
    name: str | None = None
    input: msgspec.Raw | UnsetType = UNSET
    tool_use_id: str | None = None
    content: str | list[ResultPart] | None = None
    is_error: bool | None = None
    cache_control: CacheControl | None = None


class ImageSource(Struct, kw_only=True, forbid_unknown_fields=True):
    """An image block's ``source``: ``base64`` (``media_type`` and ``data``) or
    ``url``."""

    type: Literal["base64", "url"]
    media_type: Literal["image/jpeg", "image/png", "image/gif", "image/webp"] | None = None
    data: msgspec.Raw | UnsetType = UNSET
    url: str | None = None


class MessageIn(Struct, kw_only=True, forbid_unknown_fields=True):
    role: Literal["user", "assistant"]
    content: str | list[Block]


class Metadata(Struct, kw_only=True, forbid_unknown_fields=True):
    """Accepted; ``user_id`` changes nothing in the answer (Anthropic's abuse tracking)."""

    user_id: str | None = None


class ToolKind(Struct, kw_only=True):
    """A tool's ``type`` alone, read before the rest (absent or ``custom``: a client tool)."""

    type: str | None = None


class ToolIn(Struct, kw_only=True, forbid_unknown_fields=True):
    name: str
    input_schema: msgspec.Raw
    description: str | None = None
    type: Literal["custom"] | None = None
    strict: bool | None = None
    cache_control: CacheControl | None = None


class ChoiceAuto(Struct, kw_only=True, forbid_unknown_fields=True, tag="auto"):
    disable_parallel_tool_use: bool | None = None


class ChoiceAny(Struct, kw_only=True, forbid_unknown_fields=True, tag="any"):
    disable_parallel_tool_use: bool | None = None


class ChoiceTool(Struct, kw_only=True, forbid_unknown_fields=True, tag="tool"):
    name: str
    disable_parallel_tool_use: bool | None = None


class ChoiceNone(Struct, kw_only=True, forbid_unknown_fields=True, tag="none"):
    pass


ToolChoice = ChoiceAuto | ChoiceAny | ChoiceTool | ChoiceNone


class Thinking(Struct, kw_only=True, forbid_unknown_fields=True):
    """Extended thinking: only ``disabled`` is served (no model here has a thinking
    budget to honour)."""

    type: Literal["disabled"]


class MessagesRequest(Struct, kw_only=True, forbid_unknown_fields=True):
    """``POST /v1/messages``."""

    model: str
    messages: Annotated[list[MessageIn], Meta(min_length=1)]
    max_tokens: MaxTokens
    system: str | list[SystemBlock] | None = None
    stop_sequences: list[str] | None = None
    stream: bool | None = None
    temperature: Temperature | None = None
    top_p: TopP | None = None
    top_k: TopK | None = None
    metadata: Metadata | None = None
    tools: list[msgspec.Raw] | None = None
    tool_choice: ToolChoice | None = None
    thinking: Thinking | None = None
    keep_alive: KeepAlive | None = None  # an extension (Ollama's): docs/models.md


class CountTokensRequest(Struct, kw_only=True, forbid_unknown_fields=True):
    """``POST /v1/messages/count_tokens``: what a messages request's prompt is made of."""

    model: str
    messages: Annotated[list[MessageIn], Meta(min_length=1)]
    system: str | list[SystemBlock] | None = None
    tools: list[msgspec.Raw] | None = None
    tool_choice: ToolChoice | None = None
    thinking: Thinking | None = None


# -- the answer ----------------------------------------------------------------------------
StopReason = Literal["end_turn", "max_tokens", "stop_sequence", "tool_use"]


class TextBlockOut(Struct, tag_field="type", tag="text"):
    text: str


class ToolUseOut(Struct, tag_field="type", tag="tool_use"):
    id: str
    name: str
    input: msgspec.Raw  # a JSON object, as the model wrote it


class MessageUsage(Struct, kw_only=True, omit_defaults=True):
    input_tokens: int
    output_tokens: int
    cache_read_input_tokens: int | None = None


class AnthropicMessage(Struct, kw_only=True, tag_field="type", tag="message"):
    id: str
    role: Literal["assistant"]
    model: str
    content: list[TextBlockOut | ToolUseOut]
    stop_reason: StopReason | None
    stop_sequence: str | None
    usage: MessageUsage


class TokenCount(Struct, kw_only=True):
    input_tokens: int


# -- the stream's events (their data; ``events.py`` writes them) -----------------------------
class TextDelta(Struct, tag_field="type", tag="text_delta"):
    text: str


class InputJsonDelta(Struct, tag_field="type", tag="input_json_delta"):
    partial_json: str


class MessageStart(Struct, tag_field="type", tag="message_start"):
    message: AnthropicMessage


class BlockStart(Struct, tag_field="type", tag="content_block_start"):
    index: int
    content_block: TextBlockOut | ToolUseOut


class Ping(Struct, tag_field="type", tag="ping"):
    pass


class BlockDelta(Struct, tag_field="type", tag="content_block_delta"):
    index: int
    delta: TextDelta | InputJsonDelta


class BlockStop(Struct, tag_field="type", tag="content_block_stop"):
    index: int


class StopDelta(Struct, kw_only=True):
    stop_reason: StopReason
    stop_sequence: str | None


class DeltaUsage(Struct, kw_only=True, omit_defaults=True):
    output_tokens: int
    input_tokens: int | None = None
    cache_read_input_tokens: int | None = None


class MessageDelta(Struct, tag_field="type", tag="message_delta"):
    delta: StopDelta
    usage: DeltaUsage


class MessageStop(Struct, tag_field="type", tag="message_stop"):
    pass


class ErrorDetail(Struct, kw_only=True):
    type: str
    message: str


class AnthropicError(Struct, tag_field="type", tag="error"):
    """The ``error`` event of a stream that failed after its head, and the shape of
    every error body on these routes."""

    error: ErrorDetail


EVENT_TYPES = (MessageStart, BlockStart, Ping, BlockDelta, BlockStop, MessageDelta, MessageStop)

messages_decoder = msgspec.json.Decoder(MessagesRequest)
count_decoder = msgspec.json.Decoder(CountTokensRequest)
tool_type_decoder = msgspec.json.Decoder(ToolKind)
tool_decoder = msgspec.json.Decoder(ToolIn)
image_source_decoder = msgspec.json.Decoder(ImageSource)
