"""The llama.cpp engine's wire: the request bodies it takes and the chunks it answers
with (its OpenAI-compatible dialect), each encoded or decoded once with msgspec.

Requests are built from the one :class:`~...chat.ChatRequest` (never from a client's
bytes): the fields the engine honours, nulls left out, ``stream`` always on with its
usage (a whole answer is assembled from the stream, so that every chunk's callback can
stop the slot: docs/architecture.md, "The llama.cpp backend"), one choice per request.
"""

from __future__ import annotations

import secrets
from typing import Any

import msgspec
from msgspec import Struct

from .... import metrics
from ...chat import ChatRequest, FunctionTool, OutputFormat, Turn
from ...chat.images import ImagePart

_encode = msgspec.json.encode
_STREAMED = {"include_usage": True}
# What stands for an image's URL in an engine request until :func:`splice_images` puts
# the image's data: URI there: random per process, so no client's text can forge one.
IMAGE_MARK = "zeroserve-image-" + secrets.token_hex(16)
_IMAGE_MARK_JSON = _encode(IMAGE_MARK)


# -- requests ------------------------------------------------------------------------------
def message(m: Turn) -> dict[str, Any]:
    """One conversation turn as the engine's chat templates take it."""
    out: dict[str, Any] = {"role": m.role}
    if m.parts is not None:  # text and images, in order (images: marks, spliced later)
        out["content"] = [
            {"type": "text", "text": p}
            if isinstance(p, str)
            else {"type": "image_url", "image_url": {"url": IMAGE_MARK}}
            for p in m.parts
        ]
    elif m.content is not None or not m.tool_calls:  # a call's turn may have no text
        out["content"] = m.content or ""
    if m.name is not None:
        out["name"] = m.name
    if m.tool_calls:
        out["tool_calls"] = [
            {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
            for c in m.tool_calls
        ]
    if m.tool_call_id is not None:
        out["tool_call_id"] = m.tool_call_id
    return out


def tool(t: FunctionTool) -> dict[str, Any]:
    """A function tool as chat's ``tools`` write it, with only the fields given."""
    function: dict[str, Any] = {"name": t.name}
    if t.description is not None:
        function["description"] = t.description
    if t.parameters is not None:
        function["parameters"] = t.parameters
    if t.strict is not None:
        function["strict"] = t.strict
    return {"type": "function", "function": function}


def response_format(fmt: OutputFormat) -> dict[str, Any]:
    if fmt.type != "json_schema":
        return {"type": fmt.type}
    schema: dict[str, Any] = {"name": fmt.name or "response", "schema": fmt.schema}
    if fmt.strict is not None:
        schema["strict"] = fmt.strict
    return {"type": "json_schema", "json_schema": schema}


def sampling(chat: ChatRequest, seed: int | None) -> dict[str, Any]:
    """The sampling fields of one engine request (``seed``: this choice's), as the
    engine spells them (``repeat_penalty``; ``ignore_eos`` biases every end-of-generation
    token away). ``min_tokens`` has no engine field: it is served only with ``ignore_eos``,
    which implies it (``app/openai/chat.py``)."""
    out: dict[str, Any] = {"stream": True, "stream_options": _STREAMED}
    if chat.ignore_eos:
        out["ignore_eos"] = True
    if chat.continuous_usage:  # each chunk's timings count the tokens so far
        out["timings_per_token"] = True
    for key, value in (
        ("max_tokens", chat.max_tokens),
        ("temperature", chat.temperature),
        ("top_p", chat.top_p),
        ("top_k", chat.top_k),
        ("min_p", chat.min_p),
        ("repeat_penalty", chat.repetition_penalty),
        ("seed", seed),
        ("presence_penalty", chat.presence_penalty),
        ("frequency_penalty", chat.frequency_penalty),
        ("logit_bias", chat.logit_bias),
    ):
        if value is not None:
            out[key] = value
    if chat.stop:
        out["stop"] = chat.stop
        if chat.report_stop:
            # The finish chunk then says which stop string matched (``__verbose``); it
            # also repeats the prompt, so it is asked for only when it must be reported.
            out["verbose"] = True
    return out


def chat_body(
    chat: ChatRequest,
    alias: str,
    messages: list[dict[str, Any]],
    seed: int | None,
    extra: dict[str, Any],
) -> bytes:
    """A chat request for the engine: ``messages`` (already as the engine takes them),
    the sampling fields, log probabilities when asked, and ``extra`` (tools, a format,
    a grammar)."""
    body: dict[str, Any] = {"model": alias, "messages": messages}
    body.update(sampling(chat, seed))
    if chat.logprobs:
        body["logprobs"] = True
        if chat.top_logprobs is not None:
            body["top_logprobs"] = chat.top_logprobs
    body.update(extra)
    encoded = _encode(body)
    return splice_images(encoded, chat.images) if chat.images else encoded


def splice_images(body: bytes, images: list[ImagePart]) -> bytes:
    """``body`` with each image mark, in order, replaced by that image's ``data:`` URI.

    The engine takes images only as base64 ``data:`` URIs in its JSON
    (docs/decisions/0032-images-stay-base64.md): each image's base64 text goes from the
    request body's view straight into this one join, its only copy (counted with the
    body, ``engine_body``). The rest of the body is copied a second time by the join
    (``engine_body_splice``): text, a few KiB beside an image's megabytes."""
    view = memoryview(body)
    pieces: list[bytes | memoryview] = []
    pos = 0
    mark = len(_IMAGE_MARK_JSON)
    for image in images:
        at = body.find(_IMAGE_MARK_JSON, pos)
        assert at >= 0, "every image of the request has its mark, in order"
        pieces += (
            view[pos:at],
            b'"data:' + image.media_type.encode() + b";base64,",
            image.base64_text(),
            b'"',
        )
        pos = at + mark
    pieces.append(view[pos:])
    metrics.count_copy("engine_body_splice", len(body) - mark * len(images))
    return b"".join(pieces)


def completion_body(chat: ChatRequest, alias: str, prompt: str, seed: int | None) -> bytes:
    """A text completion request for the engine (``logprobs``: the count of
    alternatives per token, as the completions API asks)."""
    body: dict[str, Any] = {"model": alias, "prompt": prompt}
    body.update(sampling(chat, seed))
    if chat.logprobs:
        body["logprobs"] = chat.top_logprobs or 0
    return _encode(body)


# -- what zeroserve reads of the engine's chunks ---------------------------------------------
class EngineError(Struct, kw_only=True):
    code: int = 500
    message: str = ""
    type: str = "server_error"


class EngineErrorBody(Struct, kw_only=True):
    error: EngineError


class EngineTimings(Struct, kw_only=True):
    cache_n: int = 0  # prompt tokens served from the prompt cache
    prompt_n: int = 0  # prompt tokens evaluated
    predicted_n: int = 0  # tokens generated


class EngineFunctionDelta(Struct, kw_only=True):
    name: str | None = None
    arguments: str | None = None


class EngineToolCallDelta(Struct, kw_only=True):
    """A fragment of a native tool call: the first names it, the rest add arguments."""

    index: int = 0
    id: str | None = None
    type: str | None = None
    function: EngineFunctionDelta | None = None


class EngineDelta(Struct, kw_only=True):
    content: str | None = None
    reasoning_content: str | None = None
    tool_calls: list[EngineToolCallDelta] | None = None


class EngineLogprobs(Struct, kw_only=True):
    content: list[msgspec.Raw] | None = None  # one entry per token, kept as it came


class EngineChunkChoice(Struct, kw_only=True):
    index: int = 0
    delta: EngineDelta | None = None  # chat
    text: str | None = None  # completions
    logprobs: EngineLogprobs | None = None
    finish_reason: str | None = None


class EnginePromptDetails(Struct, kw_only=True):
    cached_tokens: int = 0


class EngineUsage(Struct, kw_only=True):
    prompt_tokens: int = 0
    completion_tokens: int = 0
    prompt_tokens_details: EnginePromptDetails | None = None


class EngineVerbose(Struct, kw_only=True):
    """The finish chunk's ``__verbose`` (asked for with ``"verbose": true``): why the
    generation stopped (``word``: a stop string, ``eos``, ``limit``) and which string."""

    stop_type: str = ""
    stopping_word: str = ""


class EngineChunk(Struct, kw_only=True):
    """The fields of an engine chunk that zeroserve reads."""

    choices: list[EngineChunkChoice] = []
    usage: EngineUsage | None = None
    timings: EngineTimings | None = None
    verbose: EngineVerbose | None = msgspec.field(default=None, name="__verbose")


class EngineEmbeddingUsage(Struct, kw_only=True, frozen=True):
    prompt_tokens: int = 0


class EngineVector(Struct, kw_only=True):
    embedding: list[float] | str  # str: base64


class EngineEmbeddings(Struct, kw_only=True):
    """What zeroserve reads of an engine's embeddings answer: the token count, and the
    vectors only when their size must be checked (``dimensions``)."""

    usage: EngineEmbeddingUsage = EngineEmbeddingUsage()
    data: list[EngineVector] = []


class EngineUsageOnly(Struct, kw_only=True):
    usage: EngineEmbeddingUsage = EngineEmbeddingUsage()


error_decoder = msgspec.json.Decoder(EngineErrorBody)
embeddings_decoder = msgspec.json.Decoder(EngineEmbeddings)
usage_decoder = msgspec.json.Decoder(EngineUsageOnly)
chunk_decoder = msgspec.json.Decoder(EngineChunk)
