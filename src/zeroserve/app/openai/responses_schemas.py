"""The OpenAI Responses API's wire schemas (``POST /v1/responses``), stateless.

Requests are decoded once by a strict schema: unknown fields get a 400 naming them, as
for chat (``schemas.py``). Every field of the official SDK's ``responses.create`` is a
field here, in one of three kinds (docs/architecture.md, "The Responses API"); whether
the serving model honours one is its backend's to say, as on chat:

* honoured: ``model``, ``input`` (a string, or items: messages with text parts, and an
  agent loop's ``function_call`` and ``function_call_output`` items), ``instructions``,
  ``max_output_tokens``, ``temperature``, ``top_p``, ``stream``, ``text.format``
  (``text``, ``json_object``, ``json_schema``), ``tools`` of type ``function`` with
  ``tool_choice`` (also ``allowed_tools`` over function tools), ``parallel_tool_calls``
  and ``max_tool_calls``;
* refused unless neutral (:data:`STATEFUL` and :func:`refusals`): the server keeps no
  state, so ``previous_response_id``, ``conversation``, ``prompt``, ``background`` and
  ``store: true`` get a 400 naming them; ``include``, ``reasoning``, ``top_logprobs`` >
  0, ``truncation: "auto"``, tools of any other type (``web_search``, ``file_search``,
  MCP, ...) and the like would change the answer;
* accepted because they never change the answer: ``metadata``, ``user``,
  ``safety_identifier``, ``service_tier``, ``prompt_cache_key``, ... .

The answer and the streamed events are Structs in OpenAI's exact shapes (field names,
``type`` tags, ``sequence_number``), so ``openai`` SDK objects parse them.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

import msgspec
from msgspec import UNSET, Meta, Struct, UnsetType

from ..keep_alive import KeepAlive
from .schemas import FunctionName, MaxTokens, PriorityClass, Temperature, TopP


# -- requests -------------------------------------------------------------------------------
class InputPart(Struct, kw_only=True, forbid_unknown_fields=True):
    """One content part of an input message. Text parts (``input_text``, and the
    ``output_text`` of an earlier answer sent back) and a user's ``input_image``
    (``image_url``: a ``data:`` URI or an ``http(s)`` URL, kept raw: app/chat/images.py)
    are served; any other type gets a 400 naming the part."""

    type: str
    text: str | None = None
    image_url: msgspec.Raw | UnsetType = UNSET
    detail: Literal["auto", "low", "high"] | None = None
    file_id: str | None = None  # an uploaded file: refused (no file store here)
    annotations: list[Any] | None = None
    logprobs: list[Any] | None = None


class InputItem(Struct, kw_only=True, forbid_unknown_fields=True):
    """One input item: a message (also an earlier answer's output message sent back),
    or an agent loop's ``function_call`` (an earlier answer's call sent back) and its
    ``function_call_output``. One Struct for the three (a message may omit ``type``, so
    the items cannot be a tagged union); the front end (``responses.py``) checks each
    type's required fields and refuses any other type, naming the item."""

    type: str = "message"
    # message
    role: Literal["user", "assistant", "system", "developer"] | None = None
    content: str | list[InputPart] | None = None
    phase: str | None = None
    # function_call and function_call_output
    call_id: str | None = None
    name: str | None = None
    namespace: str | None = None
    arguments: str | None = None
    output: str | list[InputPart] | None = None
    caller: Any = None
    id: str | None = None
    status: str | None = None


class ItemType(Struct, kw_only=True):
    """Only an input item's ``type`` (read when the strict decode failed inside
    ``input``, so an item of another type is refused by its type)."""

    type: str = "message"


class ItemTypes(Struct, kw_only=True):
    input: str | list[ItemType]


item_types_decoder = msgspec.json.Decoder(ItemTypes)


class FunctionToolIn(Struct, kw_only=True, forbid_unknown_fields=True):
    """A function tool as the Responses API writes it (flat, not under ``function``)."""

    type: Literal["function"]
    name: FunctionName
    description: str | None = None
    # Kept as it came: a backend may compile it into a grammar.
    parameters: msgspec.Raw | UnsetType = UNSET
    strict: bool | None = None


class ToolType(Struct, kw_only=True):
    """Only a tool's ``type`` (read first, so another type is refused by name)."""

    type: str


class FunctionChoice(
    Struct, kw_only=True, forbid_unknown_fields=True, tag_field="type", tag="function"
):
    """``{"type": "function", "name": ...}``: that function must be called."""

    name: str


class AllowedChoice(
    Struct, kw_only=True, forbid_unknown_fields=True, tag_field="type", tag="allowed_tools"
):
    """``{"type": "allowed_tools", "mode", "tools"}``: the model may call only these
    ``tools`` (each written as a function choice), and must call one (``required``) or
    may answer text instead (``auto``). Tools of other types are not served."""

    mode: Literal["auto", "required"]
    tools: Annotated[list[FunctionChoice], Meta(min_length=1)]


ToolChoiceIn = Literal["none", "auto", "required"] | FunctionChoice | AllowedChoice

tool_type_decoder = msgspec.json.Decoder(ToolType)
function_tool_decoder = msgspec.json.Decoder(FunctionToolIn)
tool_choice_decoder = msgspec.json.Decoder(ToolChoiceIn)


class TextFormat(Struct, kw_only=True, forbid_unknown_fields=True):
    type: Literal["text", "json_object", "json_schema"]
    name: str | None = None
    description: str | None = None
    # Kept as it came: a backend may compile it into a grammar.
    schema: msgspec.Raw | UnsetType = UNSET
    strict: bool | None = None


class TextConfig(Struct, kw_only=True, forbid_unknown_fields=True):
    format: TextFormat | None = None
    verbosity: Literal["low", "medium", "high"] | None = None


class ResponsesStreamOptions(Struct, kw_only=True, forbid_unknown_fields=True):
    include_obfuscation: bool | None = None  # no effect: nothing is obfuscated here


class ResponsesRequest(Struct, kw_only=True, forbid_unknown_fields=True):
    model: str
    input: str | Annotated[list[InputItem], Meta(min_length=1)]
    instructions: str | None = None
    max_output_tokens: MaxTokens | None = None
    temperature: Temperature | None = None
    top_p: TopP | None = None
    stream: bool | None = False
    stream_options: ResponsesStreamOptions | None = None
    text: TextConfig | None = None
    # Raw until the front end checks them (each tool's type first).
    tools: list[msgspec.Raw] | None = None
    tool_choice: msgspec.Raw | UnsetType = UNSET
    parallel_tool_calls: bool | None = None
    max_tool_calls: Annotated[int, Meta(ge=1)] | None = None
    priority: PriorityClass | None = None
    keep_alive: KeepAlive | None = None
    # Refused unless neutral (see ``refusals``).
    previous_response_id: str | None = None
    conversation: Any = None
    prompt: Any = None
    store: bool | None = None
    background: bool | None = None
    background_options: Any = None
    include: list[str] | None = None
    reasoning: Any = None
    top_logprobs: int | None = None
    truncation: Literal["auto", "disabled"] | None = None
    context_management: Any = None
    moderation: Any = None
    access_programs: Any = None
    image: Any = None
    # Accepted, no effect on the answer.
    metadata: dict[str, str] | None = None
    user: str | None = None
    safety_identifier: str | None = None
    service_tier: str | None = None
    prompt_cache_key: str | None = None
    prompt_cache_retention: str | None = None
    prompt_cache_options: Any = None


responses_decoder = msgspec.json.Decoder(ResponsesRequest)

# Parameters that need state this server does not keep: each gets a 400 naming it.
STATEFUL = ("previous_response_id", "conversation", "prompt", "background_options")


def refusals(req: ResponsesRequest) -> list[tuple[str, str]]:
    """``(param, why)`` for every parameter given with a value this server cannot
    honour (the first one is answered 400)."""
    out: list[tuple[str, str]] = []
    stateful = (req.previous_response_id, req.conversation, req.prompt, req.background_options)
    for name, value in zip(STATEFUL, stateful, strict=True):
        if value is not None:
            out.append((name, "this server is stateless: it keeps no responses or conversations"))
    if req.store:
        out.append(("store", "this server is stateless: store must be false or absent"))
    if req.background:
        out.append(("background", "background responses need stored state"))
    if req.include:
        out.append(("include", "no extra output can be included"))
    if req.reasoning is not None:
        out.append(("reasoning", "the serving model does not reason"))
    if req.top_logprobs:
        out.append(("top_logprobs", "logprobs are not supported on /v1/responses"))
    if req.truncation == "auto":
        out.append(("truncation", "only truncation 'disabled' is supported"))
    if req.text is not None and req.text.verbosity not in (None, "medium"):
        out.append(("text.verbosity", "the serving model has no verbosity control"))
    others = (
        ("context_management", req.context_management),
        ("moderation", req.moderation),
        ("access_programs", req.access_programs),
        ("image", req.image),
    )
    for name, value in others:
        if value is not None:
            out.append((name, "this parameter is not supported by the serving model"))
    return out


# -- the answer -----------------------------------------------------------------------------
class OutputText(Struct, kw_only=True):
    type: Literal["output_text"] = "output_text"
    text: str
    annotations: list[Any] = []
    logprobs: list[Any] = []


class OutputMessage(Struct, kw_only=True, tag_field="type", tag="message"):
    id: str
    status: Literal["in_progress", "completed", "incomplete"]
    role: Literal["assistant"] = "assistant"
    content: list[OutputText]


class FunctionCallOut(Struct, kw_only=True, tag_field="type", tag="function_call"):
    """A ``function_call`` output item: the model calls one of the request's tools."""

    id: str
    status: Literal["in_progress", "completed", "incomplete"]
    call_id: str
    name: str
    arguments: str


OutputItem = OutputMessage | FunctionCallOut


class FunctionToolOut(Struct, kw_only=True):
    """A function tool as the answer echoes it."""

    type: Literal["function"] = "function"
    name: str
    description: str | None
    parameters: msgspec.Raw | None
    strict: bool | None


class InputTokensDetails(Struct, kw_only=True):
    cached_tokens: int = 0
    # The prompt tokens the engine computed and keeps in the slot's prompt cache for
    # the next request (llama.cpp caches every prompt; the SDK requires the field).
    cache_write_tokens: int = 0


class OutputTokensDetails(Struct, kw_only=True):
    reasoning_tokens: int = 0


class ResponseUsage(Struct, kw_only=True):
    input_tokens: int
    input_tokens_details: InputTokensDetails
    output_tokens: int
    output_tokens_details: OutputTokensDetails
    total_tokens: int


class IncompleteDetails(Struct, kw_only=True):
    reason: Literal["max_output_tokens", "content_filter"]


class ResponseError(Struct, kw_only=True):
    code: str
    message: str


class Reasoning(Struct, kw_only=True, frozen=True):
    effort: None = None
    summary: None = None


class FormatOut(Struct, kw_only=True, omit_defaults=True):
    type: Literal["text", "json_object", "json_schema"]
    name: str | UnsetType = UNSET
    description: str | UnsetType = UNSET
    schema: msgspec.Raw | UnsetType = UNSET
    strict: bool | UnsetType = UNSET


class TextOut(Struct, kw_only=True):
    format: FormatOut
    verbosity: Literal["low", "medium", "high"] = "medium"


class ResponseObject(Struct, kw_only=True):
    """A response (``object: "response"``): the whole answer, and the snapshot the
    lifecycle events of a stream carry."""

    id: str
    object: Literal["response"] = "response"
    created_at: int
    status: Literal["in_progress", "completed", "incomplete", "failed"]
    background: bool = False
    error: ResponseError | None = None
    incomplete_details: IncompleteDetails | None = None
    instructions: str | None
    max_output_tokens: int | None
    max_tool_calls: int | None = None
    model: str
    output: list[OutputItem]
    parallel_tool_calls: bool = True
    previous_response_id: None = None
    prompt_cache_key: str | None = None
    reasoning: Reasoning = Reasoning()
    safety_identifier: str | None = None
    service_tier: str = "default"
    store: bool = False
    temperature: float
    text: TextOut
    tool_choice: Literal["auto", "none", "required"] | FunctionChoice | AllowedChoice = "auto"
    tools: list[FunctionToolOut] = []
    top_logprobs: int = 0
    top_p: float
    truncation: Literal["disabled"] = "disabled"
    usage: ResponseUsage | None = None
    user: str | None = None
    metadata: dict[str, str] = {}


# -- stream events (``event: <type>`` + ``data: <the event>``) -------------------------------
class LifecycleEvent(Struct, kw_only=True):
    """``response.created``, ``.in_progress``, ``.completed``, ``.incomplete``, ``.failed``."""

    type: str
    sequence_number: int
    response: ResponseObject


class OutputItemEvent(Struct, kw_only=True):
    """``response.output_item.added`` and ``response.output_item.done``."""

    type: str
    sequence_number: int
    output_index: int
    item: OutputItem


class ContentPartEvent(Struct, kw_only=True):
    """``response.content_part.added`` and ``response.content_part.done``."""

    type: str
    sequence_number: int
    item_id: str
    output_index: int
    content_index: int
    part: OutputText


class TextDeltaEvent(Struct, kw_only=True):
    type: Literal["response.output_text.delta"] = "response.output_text.delta"
    sequence_number: int
    item_id: str
    output_index: int
    content_index: int
    delta: str
    logprobs: list[Any] = []


class TextDoneEvent(Struct, kw_only=True):
    type: Literal["response.output_text.done"] = "response.output_text.done"
    sequence_number: int
    item_id: str
    output_index: int
    content_index: int
    text: str
    logprobs: list[Any] = []


class ArgumentsDeltaEvent(Struct, kw_only=True):
    type: Literal["response.function_call_arguments.delta"] = (
        "response.function_call_arguments.delta"
    )
    sequence_number: int
    item_id: str
    output_index: int
    delta: str


class ArgumentsDoneEvent(Struct, kw_only=True):
    type: Literal["response.function_call_arguments.done"] = "response.function_call_arguments.done"
    sequence_number: int
    item_id: str
    output_index: int
    arguments: str


class ErrorEvent(Struct, kw_only=True):
    """A failure after the stream began (the status line was already sent)."""

    type: Literal["error"] = "error"
    sequence_number: int
    code: str | None
    message: str
    param: str | None


ResponseEvent = (
    LifecycleEvent
    | OutputItemEvent
    | ContentPartEvent
    | TextDeltaEvent
    | TextDoneEvent
    | ArgumentsDeltaEvent
    | ArgumentsDoneEvent
    | ErrorEvent
)
# The same, as the types /openapi.json describes (untagged: ``type`` is a plain field).
EVENT_TYPES = (
    LifecycleEvent,
    OutputItemEvent,
    ContentPartEvent,
    TextDeltaEvent,
    TextDoneEvent,
    ArgumentsDeltaEvent,
    ArgumentsDoneEvent,
    ErrorEvent,
)

__all__ = [
    "EVENT_TYPES",
    "STATEFUL",
    "ResponseEvent",
    "ResponseObject",
    "ResponsesRequest",
    "refusals",
    "responses_decoder",
]
