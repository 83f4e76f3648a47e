"""OpenAI wire schemas as msgspec Structs, with the decoders and encoder built once.

Requests are decoded straight from the body view (``req.body`` is a memoryview of the
arena lease; msgspec reads buffers without copying them). Unknown fields are refused
with a 400 naming them (``forbid_unknown_fields``); every OpenAI parameter is a field,
either honoured, refused unless neutral, or accepted because it never changes the answer
(``user``, ``metadata``, ``store``, ...): nothing is silently dropped. Range
checks are ``msgspec.Meta`` constraints, so a bad value fails at decode time and
:func:`decode` turns msgspec's message into a 400 whose ``param`` names the field.

Responses are Structs with ``omit_defaults``: fields left ``UNSET`` are not written, so
``usage`` appears (as ``null``, then as the usage chunk) only when the client asked for
it with ``stream_options.include_usage``, as OpenAI does.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Annotated, Any, Literal, TypeVar

import msgspec
from msgspec import UNSET, Meta, Struct, UnsetType

from ...errors import RequestError
from ...runtime.classes import MAX_PRIORITY, MIN_PRIORITY
from .. import limits as lim
from ..keep_alive import KeepAlive

if TYPE_CHECKING:
    from typing_extensions import TypeIs

Temperature = Annotated[float, Meta(ge=0.0, le=2.0)]
TopP = Annotated[float, Meta(ge=0.0, le=1.0)]
# How many stop strings and choices a request may ask for are configurable counts,
# checked by the endpoint (app/limits.py: MAX_STOP, MAX_N).
Stop = str | list[str]
N = Annotated[int, Meta(ge=1)]
# Ranges that protect the code below the schema (see app/limits.py).
MaxTokens = Annotated[int, Meta(ge=1, le=lim.MAX_TOKENS)]
Seed = Annotated[int, Meta(ge=lim.SEED_MIN, le=lim.SEED_MAX)]
# The request's priority class (vLLM's field: lower runs first; app/priorities.py).
PriorityClass = Annotated[
    int,
    Meta(
        ge=MIN_PRIORITY,
        le=MAX_PRIORITY,
        description="The request's priority class: lower runs first (vLLM's meaning). "
        "Waiting requests are served by class, a class rising one step per second waited; "
        "an API key may set a default and a highest class it may ask for.",
    ),
]


# -- requests -------------------------------------------------------------------------------
# One decoded request type per route, the same whatever backend serves the model
# (docs/architecture.md, "One chat path"): every OpenAI parameter is a field, typed as
# OpenAI types it, and unknown fields are refused by name (``forbid_unknown_fields``).
# Whether a backend honours a parameter is the backend's to say (a 400 naming it); the
# shape is judged here, once.
#
# ``response_format``, ``tools`` and ``tool_choice`` are kept as raw JSON at first: their
# size is checked before anything decodes them or compiles them into a grammar.

# Largest ``response_format`` (with its JSON schema) accepted, in bytes. Real schemas are
# a few KiB; an engine compiles the schema into a grammar, whose cost grows with its
# size, so 64 KiB bounds that work while leaving room for large API schemas.
MAX_RESPONSE_FORMAT_BYTES = 64 * 1024
# Largest ``tools`` array accepted, in bytes (the same reason: each tool's parameters
# become a grammar; OpenAI allows 128 tools, a few hundred bytes each).
MAX_TOOLS_BYTES = 128 * 1024
# OpenAI's bound for ``top_logprobs``: one constant, in app/limits.py.
MAX_TOP_LOGPROBS = lim.MAX_TOP_LOGPROBS

Penalty = Annotated[float, Meta(ge=-2.0, le=2.0)]
Bias = Annotated[float, Meta(ge=-100.0, le=100.0)]
TopLogprobs = Annotated[int, Meta(ge=0, le=MAX_TOP_LOGPROBS)]
# vLLM's sampling extensions (docs/architecture.md, "One chat path"): ``top_k`` -1 or 0
# is every token (neutral); ``min_p`` a fraction of the likeliest token's probability;
# ``repetition_penalty`` divides the logits of tokens already seen (1 neutral; bounded
# away from 0, whose division would make them infinite); ``min_tokens`` at most
# ``max_tokens``.
TopK = Annotated[int, Meta(ge=-1, le=1 << 20)]  # a vocabulary is far smaller
MinP = Annotated[float, Meta(ge=0.0, le=1.0)]
RepetitionPenalty = Annotated[float, Meta(ge=0.01, le=10.0)]
MinTokens = Annotated[
    int,
    Meta(
        ge=0,
        le=lim.MAX_TOKENS,
        description="At most max_tokens. Served only with ignore_eos: true and no stop, "
        "which make the answer run to max_tokens.",
    ),
]


def given(raw: msgspec.Raw | UnsetType | None) -> TypeIs[msgspec.Raw]:
    """Whether a raw field was sent with a value (not absent, not ``null``)."""
    return isinstance(raw, msgspec.Raw) and len(raw) > 0 and bytes(raw) != b"null"


def json_object(raw: msgspec.Raw | UnsetType | None, param: str) -> msgspec.Raw | None:
    """A raw JSON Schema field (tool ``parameters``, a format's ``schema``): ``None`` when
    absent or ``null``, else the raw object; any other JSON value is a 400 naming
    ``param`` (the engine would refuse it later, without naming the field)."""
    if not given(raw):
        return None
    if bytes(memoryview(raw)[:1]) != b"{":
        raise RequestError(f"'{param}' must be a JSON Schema object", param=param)
    return raw


class StreamOptions(Struct, kw_only=True, forbid_unknown_fields=True):
    include_usage: bool | None = False
    # vLLM's: with include_usage, every chunk carries the usage so far.
    continuous_usage_stats: bool | None = False
    include_obfuscation: bool | None = None  # no effect: nothing is obfuscated here


class ImageUrl(Struct, kw_only=True, forbid_unknown_fields=True):
    """An image part's image: ``url`` is a ``data:`` URI (base64) or an ``http(s)`` URL,
    kept raw: a view of the body, so the image's text is never copied into a ``str``
    (app/chat/images.py)."""

    url: msgspec.Raw
    detail: Literal["auto", "low", "high"] | None = None


class ContentPart(Struct, kw_only=True, forbid_unknown_fields=True):
    """One part of a message's content. Text and image parts are served (an image to a
    model that reads images); the others are refused with a 400 naming the part."""

    type: Literal["text", "image_url", "input_audio", "file", "refusal"]
    text: str | None = None
    image_url: ImageUrl | None = None
    input_audio: Any = None
    file: Any = None
    refusal: str | None = None


class ToolCallFunction(Struct, kw_only=True):
    name: str
    arguments: str = ""


class ToolCallIn(Struct, kw_only=True, forbid_unknown_fields=True):
    """A tool call of an earlier assistant message in the conversation."""

    id: str | None = None
    type: Literal["function"] = "function"
    function: ToolCallFunction


class Message(Struct, kw_only=True, forbid_unknown_fields=True):
    role: Literal["system", "developer", "user", "assistant", "tool", "function"]
    content: str | list[ContentPart] | None = None
    name: str | None = None
    tool_call_id: str | None = None
    tool_calls: list[ToolCallIn] | None = None
    refusal: str | None = None  # an earlier answer's, sent back: no effect
    function_call: Any = None  # deprecated by OpenAI: refused when given


class JsonSchemaFormat(Struct, kw_only=True, forbid_unknown_fields=True):
    name: str
    description: str | None = None
    # msgspec.Raw: passed to the engine as it came (the engine compiles it).
    schema: msgspec.Raw | UnsetType = UNSET
    strict: bool | None = None


class ResponseFormat(Struct, kw_only=True, forbid_unknown_fields=True):
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None


# A function's name, as OpenAI allows it (and templates and grammars can carry it).
FunctionName = Annotated[str, Meta(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_-]+$")]


class FunctionDef(Struct, kw_only=True, forbid_unknown_fields=True):
    name: FunctionName
    description: str | None = None
    parameters: msgspec.Raw | UnsetType = UNSET
    strict: bool | None = None


class Tool(Struct, kw_only=True, forbid_unknown_fields=True):
    type: Literal["function"]
    function: FunctionDef


class NamedFunction(Struct, kw_only=True, forbid_unknown_fields=True):
    name: str


class NamedToolChoice(
    Struct, kw_only=True, forbid_unknown_fields=True, tag_field="type", tag="function"
):
    """``{"type": "function", "function": {"name": ...}}``: that function must be called."""

    function: NamedFunction


class AllowedTools(Struct, kw_only=True, forbid_unknown_fields=True):
    """Which of ``tools`` the model may call (each written as a named choice), and
    whether it must call one (``required``) or may answer text instead (``auto``)."""

    mode: Literal["auto", "required"]
    tools: Annotated[list[NamedToolChoice], Meta(min_length=1)]


class AllowedToolChoice(
    Struct, kw_only=True, forbid_unknown_fields=True, tag_field="type", tag="allowed_tools"
):
    """``{"type": "allowed_tools", "allowed_tools": {"mode", "tools"}}`` (chat's shape;
    the Responses API's is flat, ``responses_schemas.py``)."""

    allowed_tools: AllowedTools


ToolChoice = Literal["none", "auto", "required"] | NamedToolChoice | AllowedToolChoice

tools_decoder = msgspec.json.Decoder(list[Tool])
tool_choice_decoder = msgspec.json.Decoder(ToolChoice)
response_format_decoder = msgspec.json.Decoder(ResponseFormat)


class ChatCompletionRequest(Struct, kw_only=True, forbid_unknown_fields=True):
    model: str
    messages: Annotated[list[Message], Meta(min_length=1)]
    max_tokens: MaxTokens | None = None
    max_completion_tokens: MaxTokens | None = None
    stop: Stop | None = None
    temperature: Temperature | None = None
    top_p: TopP | None = None
    seed: Seed | None = None
    n: N | None = None
    priority: PriorityClass | None = None
    keep_alive: KeepAlive | None = None
    stream: bool | None = False
    stream_options: StreamOptions | None = None
    logprobs: bool | None = None
    top_logprobs: TopLogprobs | None = None
    presence_penalty: Penalty | None = None
    frequency_penalty: Penalty | None = None
    logit_bias: dict[str, Bias] | None = None
    # vLLM's sampling extensions, honoured where the serving backend can (else a 400).
    top_k: TopK | None = None
    min_p: MinP | None = None
    repetition_penalty: RepetitionPenalty | None = None
    ignore_eos: bool | None = None
    min_tokens: MinTokens | None = None
    response_format: msgspec.Raw | UnsetType = UNSET
    tools: msgspec.Raw | UnsetType = UNSET
    tool_choice: msgspec.Raw | UnsetType = UNSET
    parallel_tool_calls: bool | None = None
    modalities: list[Literal["text"]] | None = None
    # Accepted, no effect on the answer.
    user: str | None = None
    metadata: dict[str, str] | None = None
    store: bool | None = None
    service_tier: str | None = None
    safety_identifier: str | None = None
    prompt_cache_key: str | None = None
    prompt_cache_retention: str | None = None
    prompt_cache_options: dict[str, Any] | None = None


class CompletionRequest(Struct, kw_only=True, forbid_unknown_fields=True):
    model: str
    # str, list[str], list[int] (one tokenised prompt) or list[list[int]]; msgspec unions
    # allow one array type, so the element union is checked by the front end.
    prompt: str | list[str | int | list[int]]
    max_tokens: Annotated[int, Meta(ge=0, le=lim.MAX_TOKENS)] | None = 16  # OpenAI's default
    stop: Stop | None = None
    temperature: Temperature | None = None
    top_p: TopP | None = None
    seed: Seed | None = None
    n: N | None = None
    priority: PriorityClass | None = None
    keep_alive: KeepAlive | None = None
    stream: bool | None = False
    stream_options: StreamOptions | None = None
    echo: bool | None = False
    logprobs: Annotated[int, Meta(ge=0, le=lim.MAX_COMPLETION_LOGPROBS)] | None = None
    best_of: Annotated[int, Meta(ge=1, le=lim.MAX_BEST_OF)] | None = None
    suffix: str | None = None
    presence_penalty: Penalty | None = None
    frequency_penalty: Penalty | None = None
    logit_bias: dict[str, Bias] | None = None
    # vLLM's sampling extensions, honoured where the serving backend can (else a 400).
    top_k: TopK | None = None
    min_p: MinP | None = None
    repetition_penalty: RepetitionPenalty | None = None
    ignore_eos: bool | None = None
    min_tokens: MinTokens | None = None
    user: str | None = None
    metadata: dict[str, str] | None = None
    store: bool | None = None
    service_tier: str | None = None
    safety_identifier: str | None = None
    prompt_cache_key: str | None = None


class EmbeddingRequest(Struct, kw_only=True, forbid_unknown_fields=True):
    model: str
    input: str | Annotated[list[str | int | list[int]], Meta(min_length=1)]
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: Annotated[int, Meta(ge=1, le=lim.MAX_DIMENSIONS)] | None = None
    priority: PriorityClass | None = None
    keep_alive: KeepAlive | None = None
    user: str | None = None  # accepted, no effect


class ModelOnly(Struct, kw_only=True):
    """Only the ``model`` of a request body (the rest is not decoded)."""

    model: str


model_only_decoder = msgspec.json.Decoder(ModelOnly)
chat_decoder = msgspec.json.Decoder(ChatCompletionRequest)
completion_decoder = msgspec.json.Decoder(CompletionRequest)
embedding_decoder = msgspec.json.Decoder(EmbeddingRequest)

T = TypeVar("T")

_AT = re.compile(r" - at `\$\.?(?P<path>[^`]*)`$")
# Characters of a parameter's name (or path) an error echoes, in ``param`` and the
# message: a name is the client's own input and may be of any length; 64 shows any
# real parameter's path whole. Longer ones are cut and end with an ellipsis.
MAX_ECHOED_PARAM_CHARS = 64
# Characters of the decoder's own message kept (its messages are one short sentence;
# this bounds one that would quote the input).
MAX_ECHOED_MESSAGE_CHARS = 200
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
        message, param = split_path(str(exc))
        where = f" '{param}'" if param else ""
        raise RequestError(f"invalid parameter{where}: {message}", param=param) from None
    except msgspec.DecodeError as exc:
        message, _ = split_path(str(exc))
        raise RequestError(f"invalid JSON body: {message}", code="invalid_json") from None


def split_path(text: str) -> tuple[str, str | None]:
    """A msgspec error's message and the path of the field at fault (clipped: never a
    long echo of the input)."""
    param: str | None = None
    m = _AT.search(text)
    if m is not None:
        param = m.group("path") or None
        text = text[: m.start()]
    text = _QUOTED.sub("(value not shown)", text)
    unknown = re.fullmatch(r"Object contains unknown field `(.*)`", text, re.DOTALL)
    if unknown is not None:
        # A forbid_unknown_fields schema: the serving model cannot honour this parameter.
        param = f"{param}.{unknown.group(1)}" if param else unknown.group(1)
        text = "this parameter is not supported by the serving model"
    missing = re.fullmatch(r"Object missing required field `(\w+)`", text)
    if missing is not None:
        param = f"{param}.{missing.group(1)}" if param else missing.group(1)
        text = "a required parameter is missing"
    if param is not None:
        param = _clip(param, MAX_ECHOED_PARAM_CHARS)
    return _clip(text, MAX_ECHOED_MESSAGE_CHARS), param


def _clip(text: str, limit: int) -> str:
    """``text`` cut to ``limit`` characters, the last an ellipsis when it was longer."""
    return text if len(text) <= limit else text[: limit - 1] + "\u2026"


# -- responses -------------------------------------------------------------------------------
class PromptTokensDetails(Struct):
    cached_tokens: int = 0


class Usage(Struct, omit_defaults=True):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    # Engines with a prompt cache say how much of the prompt it served.
    prompt_tokens_details: PromptTokensDetails | UnsetType = UNSET


class EmbeddingUsage(Struct):
    prompt_tokens: int
    total_tokens: int


class ModelCapabilities(Struct):
    """What a model serves, so a client can ask before it sends.

    ``chat``: chat completions, completions and the Responses API; ``embeddings``;
    ``parameters``: the optional chat parameters it honours beyond those every chat
    model honours (``max_tokens``, ``temperature``, ``top_p``, ``seed``, ``stop``, ``n``,
    streaming and usage), as chat completions spells them; any other is refused with a
    400 naming it when given at a value that would change the answer; ``relayed``: an
    upstream server answers, and decides what it accepts; ``context_length``: tokens of
    one request's context (prompt and answer), when known;
    ``embedding_dimensions``: the width of its embeddings when fixed, the only
    ``dimensions`` it serves; ``token_inputs``: whether it embeds token arrays (else
    only text, and a token array is refused with a 400 naming ``input``);
    ``tokenizer``: whether ``/tokenize`` and ``/detokenize`` serve it (with
    ``relayed``: they are relayed to the upstream's own, which answers or refuses them,
    as it does chat); ``rerank``: how
    ``/v1/rerank`` scores with it (``cross-encoder``: a reranker reads query and
    document together; ``bi-encoder``: the cosine of their embeddings, a weaker
    ranking), null when it does not rerank;
    ``input_modalities``: what its chats may carry (``image``: image parts; a model
    without it refuses an image with a 400 naming the part)."""

    chat: bool
    embeddings: bool
    parameters: list[
        Literal[
            "logprobs",
            "top_logprobs",
            "presence_penalty",
            "frequency_penalty",
            "logit_bias",
            "response_format",
            "tools",
            "tool_choice",
            "max_tool_calls",
            "top_k",
            "min_p",
            "repetition_penalty",
            "ignore_eos",
            "min_tokens",
        ]
    ]
    relayed: bool
    context_length: int | None
    embedding_dimensions: int | None
    token_inputs: bool
    tokenizer: bool
    rerank: Literal["cross-encoder", "bi-encoder"] | None
    input_modalities: list[Literal["text", "image"]]


class ModelLoadStatus(Struct, omit_defaults=True):
    """A catalog model's state, in llama.cpp's router shape: ``value`` is ``unloaded``,
    ``loading``, ``loaded`` or ``unloading``; a model whose last load failed is
    ``unloaded`` with ``failed`` true and the ``reason``; a loaded model whose engine
    process died is ``loaded`` with ``failed`` true and the ``reason`` until a new one
    serves (it is started at once). ``replacing`` is true while a
    loaded model's new version loads and its old version finishes its work (docs/
    models.md, "Replacing a loaded model")."""

    value: Literal["unloaded", "loading", "loaded", "unloading"]
    failed: bool = False
    reason: str | UnsetType = UNSET
    replacing: bool = False


class ModelCard(Struct, omit_defaults=True):
    """One model. ``capabilities`` are known once it is loaded; ``status`` is given when
    models come and go at run time (docs/architecture.md, "Models at run time")."""

    id: str
    object: str
    created: int
    owned_by: str
    description: str
    capabilities: ModelCapabilities | UnsetType = UNSET
    status: ModelLoadStatus | UnsetType = UNSET


class ModelList(Struct):
    object: str
    data: list[ModelCard]


class FunctionCall(Struct):
    name: str
    arguments: str


class ToolCallOut(Struct):
    id: str
    type: str
    function: FunctionCall


class ChatMessage(Struct, omit_defaults=True):
    role: str
    content: str | None
    refusal: None = None
    tool_calls: list[ToolCallOut] | UnsetType = UNSET
    reasoning_content: str | UnsetType = UNSET


class ChatChoice(Struct):
    index: int
    message: ChatMessage
    logprobs: msgspec.Raw | None
    finish_reason: str


class ChatCompletion(Struct):
    id: str
    object: str
    created: int
    model: str
    choices: list[ChatChoice]
    usage: Usage


class ToolCallDelta(Struct, omit_defaults=True):
    index: int
    id: str | UnsetType = UNSET
    type: str | UnsetType = UNSET
    function: dict[str, str] | UnsetType = UNSET


class Delta(Struct, omit_defaults=True):
    role: str | UnsetType = UNSET
    content: str | UnsetType | None = UNSET
    reasoning_content: str | UnsetType = UNSET
    tool_calls: list[ToolCallDelta] | UnsetType = UNSET


class ChunkChoice(Struct):
    index: int
    delta: Delta
    logprobs: msgspec.Raw | None
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
    logprobs: msgspec.Raw | None
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
