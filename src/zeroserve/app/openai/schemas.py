"""OpenAI wire schemas as msgspec Structs, with the decoders and encoder built once.

Requests are decoded straight from the body view (``req.body`` is a memoryview of the
arena lease; msgspec reads buffers without copying them). Unknown fields are ignored,
because OpenAI clients send many (``user``, ``logit_bias``, ``metadata``, ...). Range
checks are ``msgspec.Meta`` constraints, so a bad value fails at decode time and
:func:`decode` turns msgspec's message into a 400 whose ``param`` names the field.

Responses are Structs with ``omit_defaults``: fields left ``UNSET`` are not written, so
``usage`` appears (as ``null``, then as the usage chunk) only when the client asked for
it with ``stream_options.include_usage``, as OpenAI does.
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal, TypeVar

import msgspec
from msgspec import UNSET, Meta, Struct, UnsetType

from ...errors import RequestError
from .. import limits as lim

Temperature = Annotated[float, Meta(ge=0.0, le=2.0)]
TopP = Annotated[float, Meta(ge=0.0, le=1.0)]
# How many stop strings and choices a request may ask for are configurable counts,
# checked by the endpoint (app/limits.py: MAX_STOP, MAX_N).
Stop = str | list[str]
N = Annotated[int, Meta(ge=1)]
# Ranges that protect the code below the schema (see app/limits.py).
MaxTokens = Annotated[int, Meta(ge=1, le=lim.MAX_TOKENS)]
Seed = Annotated[int, Meta(ge=lim.SEED_MIN, le=lim.SEED_MAX)]


# -- requests -------------------------------------------------------------------------------
class StreamOptions(Struct, kw_only=True):
    include_usage: bool = False


class ContentPart(Struct, kw_only=True):
    """One part of a message's content. Only ``{"type": "text"}`` parts are supported by
    text models; others are refused with a 400 naming the part."""

    type: str
    text: str | None = None


class Message(Struct, kw_only=True):
    role: Literal["system", "developer", "user", "assistant", "tool", "function"]
    content: str | list[ContentPart] | None = None
    name: str | None = None


class ChatCompletionRequest(Struct, kw_only=True):
    model: str
    messages: Annotated[list[Message], Meta(min_length=1)]
    max_tokens: MaxTokens | None = None
    max_completion_tokens: MaxTokens | None = None
    stop: Stop | None = None
    temperature: Temperature | None = None
    top_p: TopP | None = None
    seed: Seed | None = None
    n: N | None = None
    stream: bool | None = False
    stream_options: StreamOptions | None = None
    logprobs: bool | None = None


class CompletionRequest(Struct, kw_only=True):
    model: str
    # str, list[str], list[int] (one tokenised prompt) or list[list[int]]; msgspec unions
    # allow one array type, so the element union is checked in the handler.
    prompt: str | list[str | int | list[int]]
    max_tokens: Annotated[int, Meta(ge=0, le=lim.MAX_TOKENS)] | None = 16  # OpenAI's default
    stop: Stop | None = None
    temperature: Temperature | None = None
    top_p: TopP | None = None
    seed: Seed | None = None
    n: N | None = None
    stream: bool | None = False
    stream_options: StreamOptions | None = None
    echo: bool | None = False
    logprobs: Annotated[int, Meta(ge=0, le=lim.MAX_COMPLETION_LOGPROBS)] | None = None
    best_of: Annotated[int, Meta(ge=1, le=lim.MAX_BEST_OF)] | None = None
    suffix: str | None = None


class EmbeddingRequest(Struct, kw_only=True):
    model: str
    input: str | Annotated[list[str | int | list[int]], Meta(min_length=1)]
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: Annotated[int, Meta(ge=1, le=lim.MAX_DIMENSIONS)] | None = None


chat_decoder = msgspec.json.Decoder(ChatCompletionRequest)
completion_decoder = msgspec.json.Decoder(CompletionRequest)
embedding_decoder = msgspec.json.Decoder(EmbeddingRequest)

T = TypeVar("T")

_AT = re.compile(r" - at `\$\.?(?P<path>[^`]*)`$")
_QUOTED = re.compile(r"'.*'", re.DOTALL)


def decode(decoder: msgspec.json.Decoder[T], body: memoryview) -> T:
    """Decode ``body`` or raise a 400 ``RequestError`` naming the offending field.

    msgspec quotes offending values in some messages (``Invalid enum value 'x'``); those
    quotes are cut so an error body never echoes the input.
    """
    if not len(body):
        raise RequestError("the request body is empty; expected a JSON object")
    try:
        with lim.decoding("the JSON body"):
            return decoder.decode(body)
    except msgspec.ValidationError as exc:
        message, param = _split_path(str(exc))
        where = f" '{param}'" if param else ""
        raise RequestError(f"invalid parameter{where}: {message}", param=param) from None
    except msgspec.DecodeError as exc:
        message, _ = _split_path(str(exc))
        raise RequestError(f"invalid JSON body: {message}", code="invalid_json") from None


def _split_path(text: str) -> tuple[str, str | None]:
    param: str | None = None
    m = _AT.search(text)
    if m is not None:
        param = m.group("path") or None
        text = text[: m.start()]
    text = _QUOTED.sub("(value not shown)", text)
    missing = re.fullmatch(r"Object missing required field `(\w+)`", text)
    if missing is not None:
        param = f"{param}.{missing.group(1)}" if param else missing.group(1)
        text = "a required parameter is missing"
    return text, param


# -- responses -------------------------------------------------------------------------------
class Usage(Struct):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


class EmbeddingUsage(Struct):
    prompt_tokens: int
    total_tokens: int


class ModelCard(Struct):
    id: str
    object: str
    created: int
    owned_by: str
    description: str


class ModelList(Struct):
    object: str
    data: list[ModelCard]


class ChatMessage(Struct):
    role: str
    content: str
    refusal: None = None


class ChatChoice(Struct):
    index: int
    message: ChatMessage
    logprobs: None
    finish_reason: str


class ChatCompletion(Struct):
    id: str
    object: str
    created: int
    model: str
    choices: list[ChatChoice]
    usage: Usage


class Delta(Struct, omit_defaults=True):
    role: str | UnsetType = UNSET
    content: str | UnsetType = UNSET


class ChunkChoice(Struct):
    index: int
    delta: Delta
    logprobs: None
    finish_reason: str | None


class ChatCompletionChunk(Struct, omit_defaults=True):
    id: str
    object: str
    created: int
    model: str
    choices: list[ChunkChoice]
    usage: Usage | UnsetType | None = UNSET


class CompletionChoice(Struct):
    text: str
    index: int
    logprobs: None
    finish_reason: str | None


class Completion(Struct, omit_defaults=True):
    id: str
    object: str
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: Usage | UnsetType | None = UNSET


class Embedding(Struct):
    object: str
    index: int
    # list[float], or little-endian float32 bytes, which msgspec writes as base64.
    embedding: Any


class EmbeddingList(Struct):
    object: str
    data: list[Embedding]
    model: str
    usage: EmbeddingUsage


encoder = msgspec.json.Encoder()
