"""The Responses API front end (``POST /v1/responses``), stateless: a request
translated once into the one chat request, its answer written as OpenAI's ``response``
object or as the stream's events (``responses_events.py``), for every backend
(docs/architecture.md, "The Responses API").

The translation:

* ``instructions`` becomes the first (system) message, ``input`` the conversation (a
  string is one user message; text parts are joined with newlines; ``developer`` is
  ``system``, which chat templates know);
* an agent loop's ``function_call`` items (an earlier answer's calls sent back) become
  an assistant message's tool calls (consecutive calls, and the assistant message just
  before them, are one message), each ``function_call_output`` a ``tool`` message;
* ``max_output_tokens``, ``temperature`` and ``top_p`` keep their meaning;
  ``text.format`` becomes the response format; ``tools`` of type ``function`` (flat:
  ``name``, ``parameters``... at the top) the chat request's tools, ``tool_choice`` its
  choice (``{"type": "function", "name"}`` a required call of that one, ``allowed_tools``
  the allowed ones), ``parallel_tool_calls`` and ``max_tool_calls`` their bounds; tools
  of any other type are a 400 naming the type;
* parameters that need state (``previous_response_id``, ``store: true``, ...) or that
  no backend honours get a 400 naming them (``responses_schemas.refusals``).

A backend's 400 names the parameter as this API spells it (``max_output_tokens``,
``text.format``, ``input``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Literal

import msgspec

from ...errors import RequestError
from ..chat import (
    ChatRequest,
    Choices,
    Collected,
    FunctionTool,
    OutputFormat,
    ToolCall,
    ToolChoice,
    Turn,
)
from ..chat.choices import collect_all
from ..chat.images import ImagePart, ImageReader
from ..deadlines import openai_timeout
from ..keep_alive import keep_alive_s
from ..limits import ApiLimits, check_count, check_output_tokens
from ..request import Request
from ..response import EVENT_STREAM, JSON, GeneratedStream, HandlerResult, Response, StreamResponse
from . import responses_schemas as r
from . import schemas as s
from .chat import check_tools, raw_param
from .responses_events import Answer, Status

# Roles of the Responses input as chat templates know them.
_ROLES: dict[str, Any] = {"developer": "system"}
_TEXT_PARTS = frozenset({"input_text", "output_text"})
# What an error message may quote of a tool's or an item's ``type``: a type's name.
_TYPE_NAME = re.compile(r"[a-z0-9_]{1,64}")
_ITEM_TYPES = ("message", "function_call", "function_call_output")
# What an item of each type must have (the decode Struct makes them all optional).
_REQUIRED = {
    "message": ("role", "content"),
    "function_call": ("call_id", "name", "arguments"),
    "function_call_output": ("call_id", "output"),
}
_NAMES = {
    "max_tokens": "max_output_tokens",
    "messages": "input",
    "response_format": "text.format",
}

Choice = Literal["auto", "none", "required"] | r.FunctionChoice | r.AllowedChoice


@dataclass(frozen=True, slots=True)
class _Origin:
    """What the answer echoes of the request: the request, its tools, its choice."""

    body: r.ResponsesRequest
    tools: list[r.FunctionToolIn]
    choice: Choice


class Responses:
    """``POST /v1/responses``."""

    upstream_path = "/responses"

    def __init__(self, limits: ApiLimits) -> None:
        self.limits = limits

    def decode(self, req: Request) -> ChatRequest:
        chat = self.parse(req.body)
        chat.timeout = openai_timeout(req, stream=chat.stream)
        return chat

    def parse(self, data: memoryview) -> ChatRequest:
        """The request body as the one chat request (what :meth:`decode` reads)."""
        body = _decode_request(data)
        limits = self.limits
        if not isinstance(body.input, str):
            check_count(len(body.input), limits.messages, "input", "input items")
        check_output_tokens(1, body.max_output_tokens, limits, "max_output_tokens")
        messages: list[Turn] = []
        if body.instructions is not None:
            messages.append(Turn("system", body.instructions))
        if isinstance(body.input, str):
            messages.append(Turn("user", body.input))
        else:
            images = ImageReader(limits)
            for i, item in enumerate(body.input):
                _add_item(messages, item, i, images)
        tools = _function_tools(body.tools or [])
        choice = _tool_choice(body.tool_choice)
        internal: ToolChoice | None = None
        if isinstance(choice, r.FunctionChoice):
            internal = ToolChoice("required", (choice.name,))
        elif isinstance(choice, r.AllowedChoice):
            internal = ToolChoice(choice.mode, tuple(c.name for c in choice.tools))
        elif s.given(body.tool_choice):
            internal = ToolChoice(choice)
        if tools:
            check_tools(
                [FunctionTool(t.name, t.description, None, t.strict) for t in tools],
                internal,
                limits,
            )
        elif internal is not None and internal.mode != "none":
            raise RequestError("tool_choice needs tools", param="tool_choice")
        fmt = body.text.format if body.text is not None else None
        return ChatRequest(
            model=body.model,
            messages=messages,
            max_tokens=body.max_output_tokens,
            temperature=body.temperature,
            top_p=body.top_p,
            priority=body.priority,
            keep_alive=keep_alive_s(body.keep_alive),
            response_format=_response_format(fmt)
            if fmt is not None and fmt.type != "text"
            else None,
            tools=[
                FunctionTool(
                    t.name,
                    t.description,
                    s.json_object(t.parameters, f"tools[{i}].parameters"),
                    t.strict,
                )
                for i, t in enumerate(tools)
            ]
            or None,
            tool_choice=internal,
            parallel_tool_calls=body.parallel_tool_calls,
            max_tool_calls=body.max_tool_calls,
            stream=bool(body.stream),
            include_usage=True,
            names=_NAMES,
            origin=_Origin(body, tools, choice),
        )

    def respond(self, choices: Choices, chat: ChatRequest, req: Request) -> HandlerResult:
        origin = chat.origin
        assert isinstance(origin, _Origin)
        answer = Answer(origin.body, origin.tools, origin.choice, chat.model)
        if chat.stream:
            return StreamResponse(
                GeneratedStream(answer.events(choices.pending[0]), choices.release),
                framing="chunked",
                content_type=EVENT_STREAM,
                headers=[(b"cache-control", b"no-cache")],
            )
        return self._whole(answer, choices)

    @staticmethod
    async def _whole(answer: Answer, choices: Choices) -> Response:
        (done,) = await collect_all(choices)
        finish = done.finish
        cut = finish is not None and finish.reason == "length"
        status: Status = "incomplete" if cut else "completed"
        out = answer.snapshot(status, _output(answer, done, status), answer.usage(finish), cut)
        return Response(200, [msgspec.json.encode(out)], content_type=JSON)


def _output(answer: Answer, done: Collected, status: Status) -> list[r.OutputItem]:
    """The whole answer's output items: its message (when it has text, or nothing
    else), then its calls."""
    calls = done.tool_calls()
    items: list[r.OutputItem] = []
    if done.parts or not calls:
        items.append(answer.message(done.text, status))
    items += [answer.call(c.id, c.name, c.arguments, status) for c in calls]
    return items


def _decode_request(body: memoryview) -> r.ResponsesRequest:
    """The strict decode and the refusals: a 400 naming the first unsupported parameter."""
    try:
        req = s.decode(r.responses_decoder, body)
    except RequestError as exc:
        if exc.param is not None and exc.param.startswith("input["):
            _check_item_types(body)  # an item of another type: named by its type
        raise
    refused = r.refusals(req)
    if refused:
        param, why = refused[0]
        raise RequestError(f"'{param}' is not supported: {why}", param=param)
    return req


def _check_item_types(body: memoryview) -> None:
    """A 400 naming the first input item whose type is not served (read only when the
    strict decode failed inside ``input``: another type's fields fail it first)."""
    try:
        items = r.item_types_decoder.decode(body).input
    except msgspec.DecodeError:  # ValidationError too: the strict decode's error stands
        return
    for i, item in enumerate(items if isinstance(items, list) else ()):
        _check_type(item.type, i)


def _check_type(kind: str, i: int) -> None:
    if kind not in _ITEM_TYPES:
        named = repr(kind) if _TYPE_NAME.fullmatch(kind) else "(value not shown)"
        raise RequestError(
            f"input items of type {named} are not supported (only {', '.join(_ITEM_TYPES)})",
            param=f"input[{i}].type",
        )


def _add_item(messages: list[Turn], item: r.InputItem, i: int, images: ImageReader) -> None:
    """``item`` (the ``i``-th input item) as the chat message it is part of."""
    _check_type(item.type, i)
    for field in _REQUIRED[item.type]:
        if msgspec.structs.asdict(item)[field] is None:
            raise RequestError(
                f"an input item of type {item.type!r} needs {field!r}", param=f"input[{i}].{field}"
            )
    if item.type == "message":
        assert item.role is not None and item.content is not None
        if item.role == "user" and isinstance(item.content, list):
            messages.append(_user_turn(item.content, i, images))
        else:
            text = _text(item.content, i, "content")
            messages.append(Turn(_ROLES.get(item.role, item.role), text))
    elif item.type == "function_call":
        assert item.call_id is not None and item.name is not None and item.arguments is not None
        call = ToolCall(item.call_id, item.name, item.arguments)
        last = messages[-1] if messages else None
        if last is not None and last.role == "assistant":
            # The same turn: the text before the calls, or the calls before this one.
            last.tool_calls = [*(last.tool_calls or ()), call]
        else:
            messages.append(Turn("assistant", None, tool_calls=[call]))
    else:
        assert item.output is not None
        messages.append(Turn("tool", _text(item.output, i, "output"), tool_call_id=item.call_id))


def _user_turn(content: list[r.InputPart], i: int, images: ImageReader) -> Turn:
    """A user message whose parts may include images (``input_image``)."""
    texts: list[str] = []
    parts: list[str | ImagePart] = []
    for j, part in enumerate(content):
        if part.type != "input_image":
            text = _text([part], i, "content", j)
            texts.append(text)
            parts.append(text)
            continue
        where = f"input[{i}].content[{j}]"
        if part.file_id is not None:
            raise RequestError(
                "images by file_id are not supported (this server keeps no files); send image_url",
                param=f"{where}.file_id",
            )
        if not isinstance(part.image_url, msgspec.Raw) or part.text is not None:
            raise RequestError(
                'an image part is {"type": "input_image", "image_url": ...}', param=where
            )
        parts.append(
            images.url(part.image_url, where, detail=part.detail, detail_param=f"{where}.detail")
        )
    text = "\n".join(texts)
    return Turn("user", text, parts=parts if len(parts) > len(texts) else None)


def _text(content: str | list[r.InputPart], i: int, field: str, first: int = 0) -> str:
    if isinstance(content, str):
        return content
    texts: list[str] = []
    for j, part in enumerate(content, first):
        if (
            part.type not in _TEXT_PARTS
            or part.text is None
            or s.given(part.image_url)
            or part.detail is not None
            or part.file_id is not None
        ):
            raise RequestError(
                "only text content parts (input_text, output_text), and input_image parts "
                "in user messages, are supported",
                param=f"input[{i}].{field}[{j}]",
            )
        texts.append(part.text)
    return "\n".join(texts)


def _function_tools(raw: list[msgspec.Raw]) -> list[r.FunctionToolIn]:
    """The request's tools, each of type ``function``; any other type is a 400 naming
    it (before anything else of the tool is read)."""
    size = sum(len(t) for t in raw)
    if size > s.MAX_TOOLS_BYTES:
        raise RequestError(
            f"tools is {size} bytes; the limit is {s.MAX_TOOLS_BYTES}", param="tools"
        )
    tools: list[r.FunctionToolIn] = []
    for i, t in enumerate(raw):
        kind = raw_param(r.tool_type_decoder, t, f"tools[{i}]").type
        if kind != "function":
            # Named when it is a type's name (an error body never echoes other input).
            named = repr(kind) if _TYPE_NAME.fullmatch(kind) else "(value not shown)"
            raise RequestError(
                f"tools of type {named} are not supported; only 'function' tools are",
                param=f"tools[{i}].type",
            )
        tools.append(raw_param(r.function_tool_decoder, t, f"tools[{i}]"))
    return tools


def _tool_choice(raw: msgspec.Raw | msgspec.UnsetType) -> Choice:
    if not s.given(raw):
        return "auto"
    try:
        choice: Choice = r.tool_choice_decoder.decode(raw)
    except msgspec.ValidationError:
        raise RequestError(
            "tool_choice must be 'none', 'auto', 'required', "
            "{'type': 'function', 'name': ...} or {'type': 'allowed_tools', 'mode': "
            "'auto' or 'required', 'tools': [{'type': 'function', 'name': ...}, ...]}; "
            "other tool choices are not supported",
            param="tool_choice",
        ) from None
    return choice


def _response_format(fmt: r.TextFormat) -> OutputFormat:
    if fmt.type != "json_schema":
        return OutputFormat(fmt.type)
    schema = s.json_object(fmt.schema, "text.format.schema")
    if schema is None:
        raise RequestError(
            "text.format of type json_schema needs a schema", param="text.format.schema"
        )
    if len(schema) > s.MAX_RESPONSE_FORMAT_BYTES:
        raise RequestError(
            f"text.format.schema is {len(schema)} bytes; the limit is "
            f"{s.MAX_RESPONSE_FORMAT_BYTES}",
            param="text.format.schema",
        )
    return OutputFormat(
        "json_schema", schema, name=fmt.name, description=fmt.description, strict=fmt.strict
    )
