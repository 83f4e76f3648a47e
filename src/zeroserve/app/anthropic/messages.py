"""Anthropic's Messages API front end (``POST /v1/messages``): a request translated once
into the one chat request, its answer written as Anthropic's ``message`` object or as
its stream's events (``events.py``), for every backend (docs/architecture.md,
"Anthropic's Messages API").

The translation:

* ``system`` (a string, or text blocks joined with newlines) becomes the first system
  turn; each message its turns: a user message's ``tool_result`` blocks become ``tool``
  turns (in order, before the message's text), its text blocks one user turn; an
  assistant message's text blocks its text and its ``tool_use`` blocks its tool calls
  (``input`` kept as the JSON text it came as). A ``tool_result`` with ``is_error:
  true`` is a tool turn whose text starts ``Error:`` (chat has no error flag; the model
  reads it as one). A user message's ``image`` blocks (a ``base64`` or ``url``
  source) are images of its user turn, in order with its text (app/chat/images.py).
* ``max_tokens`` (required), ``temperature``, ``top_p``, ``top_k`` and
  ``stop_sequences`` keep their meaning; ``tools`` (client tools: ``name``,
  ``description``, ``input_schema``) become function tools; ``tool_choice`` ``auto``,
  ``any`` (a required call), ``tool`` (a required call of that one) and ``none``, with
  ``disable_parallel_tool_use`` bounding the calls to one.
* a last message from the assistant is a prefill: the answer continues it
  (``ChatRequest.continues``; llama.cpp's engine does, a model's own template cannot
  and its backend refuses it by name).
* ``metadata.user_id``, ``cache_control`` and ``thinking: {"type": "disabled"}`` are
  accepted (none changes the answer); anything else unknown is a 400 naming it, and a
  backend's 400 names the parameter as this API spells it (``stop_sequences``).

The answer's ``stop_reason``: ``tool_use`` when it made calls, ``max_tokens`` when cut,
``stop_sequence`` (with the string) when a stop sequence ended it, else ``end_turn``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TypeVar

import msgspec

from ...errors import RequestError, ZeroserveError
from ..chat import ChatRequest, Choices, FunctionTool, ToolCall, ToolChoice, Turn
from ..chat.choices import collect_all
from ..chat.images import ImagePart, ImageReader
from ..chat.output import Collected, Finish
from ..deadlines import openai_timeout
from ..keep_alive import keep_alive_s
from ..limits import ApiLimits, check_count, check_output_tokens
from ..openai.chat import check_tools, raw_param
from ..openai.schemas import MAX_TOOLS_BYTES, decode
from ..request import Request
from ..response import EVENT_STREAM, JSON, GeneratedStream, HandlerResult, Response, StreamResponse
from . import schemas as a
from .events import MessageEvents, new_id, stop_reason

# How this API spells the chat request's parameters (for the 400s that name them).
_NAMES: Mapping[str, str] = {
    "stop": "stop_sequences",
    "parallel_tool_calls": "tool_choice.disable_parallel_tool_use",
}
# What an error message may quote of a block's or a tool's ``type``: a type's name.
_TYPE_NAME = re.compile(r"[a-z0-9_]{1,64}")
_ERROR_PREFIX = "Error: "
_T = TypeVar("_T")


def _named(kind: str) -> str:
    return repr(kind) if _TYPE_NAME.fullmatch(kind) else "(value not shown)"


@dataclass(frozen=True, slots=True)
class Prompt:
    """What a Messages request and a token count share: the conversation and tools."""

    turns: list[Turn]
    tools: list[FunctionTool] | None
    choice: ToolChoice | None
    parallel: bool | None


def prompt(
    system: str | list[a.SystemBlock] | None,
    messages: list[a.MessageIn],
    raw_tools: list[msgspec.Raw] | None,
    choice: a.ToolChoice | None,
    limits: ApiLimits,
) -> Prompt:
    """The conversation, tools and tool choice of a request, checked."""
    check_count(len(messages), limits.messages, "messages", "messages")
    turns: list[Turn] = []
    images = ImageReader(limits)
    if system is not None:
        text = system if isinstance(system, str) else "\n".join(b.text for b in system)
        turns.append(Turn("system", text))
    for i, m in enumerate(messages):
        _add_message(turns, m, i, images)
    tools = _tools(raw_tools, limits) if raw_tools is not None else None
    internal, parallel = _tool_choice(choice)
    if tools:
        check_tools(tools, internal, limits)
    elif internal is not None and internal.mode != "none":
        raise RequestError("tool_choice needs tools", param="tool_choice")
    return Prompt(turns, tools or None, internal, parallel)


def _add_message(turns: list[Turn], m: a.MessageIn, i: int, images: ImageReader) -> None:
    if isinstance(m.content, str):
        turns.append(Turn(m.role, m.content))
        return
    texts: list[str] = []
    parts: list[str | ImagePart] = []
    calls: list[ToolCall] = []
    for j, block in enumerate(m.content):
        where = f"messages[{i}].content[{j}]"
        kind = block.type
        if kind == "text":
            texts.append(_need(block.text, where, "text"))
            parts.append(texts[-1])
        elif kind == "image" and m.role == "user":
            parts.append(_image(block, where, images))
        elif kind == "tool_use" and m.role == "assistant":
            call_id = _need(block.id, where, "id")
            name = _need(block.name, where, "name")
            if not isinstance(block.input, msgspec.Raw):
                raise RequestError("this content block needs 'input'", param=f"{where}.input")
            calls.append(ToolCall(call_id, name, bytes(block.input).decode()))
        elif kind == "tool_result" and m.role == "user":
            call_id = _need(block.tool_use_id, where, "tool_use_id")
            text = _result_text(block.content, where)
            if block.is_error:
                text = _ERROR_PREFIX + text
            turns.append(Turn("tool", text, tool_call_id=call_id))
        else:
            raise RequestError(
                f"content blocks of type {_named(kind)} are not supported in a {m.role} "
                "message (text, image, tool_use in assistant messages, tool_result in user "
                "messages)",
                param=f"{where}.type",
            )
    if m.role == "assistant":
        if texts or calls:
            turns.append(
                Turn("assistant", "\n".join(texts) if texts else None, tool_calls=calls or None)
            )
    elif len(parts) > len(texts):
        turns.append(Turn("user", "\n".join(texts), parts=parts))
    elif texts or not turns or turns[-1].role != "tool":
        turns.append(Turn("user", "\n".join(texts)))


def _image(block: a.Block, where: str, images: ImageReader) -> ImagePart:
    """An image block: its source read (the base64 data stays a view of the body)."""
    if not isinstance(block.source, msgspec.Raw):
        raise RequestError("this content block needs 'source'", param=f"{where}.source")
    source: a.ImageSource = raw_param(a.image_source_decoder, block.source, f"{where}.source")
    if source.type == "url":
        return images.remote(_need(source.url, where, "source.url"), where)
    if not isinstance(source.data, msgspec.Raw):
        raise RequestError("a base64 source needs 'data'", param=f"{where}.source.data")
    if source.media_type is None:
        raise RequestError("a base64 source needs 'media_type'", param=f"{where}.source.media_type")
    return images.base64(source.data, source.media_type, where)


def _need(value: _T | None, where: str, field: str) -> _T:
    if value is None:
        raise RequestError(f"this content block needs {field!r}", param=f"{where}.{field}")
    return value


def _result_text(content: str | list[a.ResultPart] | None, where: str) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    texts: list[str] = []
    for k, part in enumerate(content):
        if part.type != "text" or part.text is None:
            raise RequestError(
                "only text parts are supported in a tool_result's content",
                param=f"{where}.content[{k}]",
            )
        texts.append(part.text)
    return "\n".join(texts)


def _tools(raw: list[msgspec.Raw], limits: ApiLimits) -> list[FunctionTool]:
    size = sum(len(t) for t in raw)
    if size > MAX_TOOLS_BYTES:
        raise RequestError(f"tools is {size} bytes; the limit is {MAX_TOOLS_BYTES}", param="tools")
    tools: list[FunctionTool] = []
    for i, t in enumerate(raw):
        kind = raw_param(a.tool_type_decoder, t, f"tools[{i}]").type
        if kind not in (None, "custom"):
            raise RequestError(
                f"tools of type {_named(kind)} are not supported; only client tools "
                "(name, description, input_schema) are",
                param=f"tools[{i}].type",
            )
        tool: a.ToolIn = raw_param(a.tool_decoder, t, f"tools[{i}]")
        tools.append(FunctionTool(tool.name, tool.description, tool.input_schema, tool.strict))
    return tools


def _tool_choice(choice: a.ToolChoice | None) -> tuple[ToolChoice | None, bool | None]:
    """The internal tool choice and whether calls may be parallel (None: not said)."""
    if choice is None:
        return None, None
    if isinstance(choice, a.ChoiceNone):
        return ToolChoice("none"), None
    parallel = False if choice.disable_parallel_tool_use else None
    if isinstance(choice, a.ChoiceAuto):
        return ToolChoice("auto"), parallel
    if isinstance(choice, a.ChoiceAny):
        return ToolChoice("required"), parallel
    return ToolChoice("required", (choice.name,)), parallel


def tool_input(arguments: str) -> msgspec.Raw:
    """A call's arguments as a ``tool_use`` block's ``input`` (a JSON object)."""
    text = arguments.strip() or "{}"
    try:
        value = msgspec.json.decode(text)
    except msgspec.DecodeError:
        value = None
    if not isinstance(value, dict):
        raise ZeroserveError("the model wrote a tool call whose arguments are not a JSON object")
    return msgspec.Raw(text.encode())


class Messages:
    """``POST /v1/messages``."""

    upstream_path = "/messages"

    def __init__(self, limits: ApiLimits) -> None:
        self.limits = limits

    def decode(self, req: Request) -> ChatRequest:
        chat = self.parse(req.body)
        chat.timeout = openai_timeout(req, stream=chat.stream)  # the Stainless SDK headers
        return chat

    def parse(self, data: memoryview) -> ChatRequest:
        """The request body as the one chat request (what :meth:`decode` reads)."""
        body = decode(a.messages_decoder, data)
        limits = self.limits
        p = prompt(body.system, body.messages, body.tools, body.tool_choice, limits)
        stops = list(body.stop_sequences or ())
        check_count(len(stops), limits.stop, "stop_sequences", "stop sequences")
        check_output_tokens(1, body.max_tokens, limits, "max_tokens")
        return ChatRequest(
            model=body.model,
            messages=p.turns,
            max_tokens=body.max_tokens,
            temperature=body.temperature,
            top_p=body.top_p,
            top_k=body.top_k,
            keep_alive=keep_alive_s(body.keep_alive),
            stop=[x for x in stops if x],
            tools=p.tools,
            tool_choice=p.choice,
            parallel_tool_calls=p.parallel,
            stream=bool(body.stream),
            include_usage=True,
            report_stop=True,
            continues=body.messages[-1].role == "assistant",
            names=_NAMES,
        )

    def respond(self, choices: Choices, chat: ChatRequest, req: Request) -> HandlerResult:
        ident = new_id("msg_")
        if chat.stream:
            events = MessageEvents(ident, chat.model, choices.prompt_tokens)
            return StreamResponse(
                GeneratedStream(events.events(choices.pending[0]), choices.release),
                framing="chunked",
                content_type=EVENT_STREAM,
                headers=[(b"cache-control", b"no-cache")],
            )
        return self._whole(ident, chat, choices)

    @staticmethod
    async def _whole(ident: str, chat: ChatRequest, choices: Choices) -> Response:
        (done,) = await collect_all(choices)
        return Response(
            200, [msgspec.json.encode(message(ident, chat.model, done))], content_type=JSON
        )


def message(ident: str, model: str, done: Collected) -> a.AnthropicMessage:
    """A whole answer as Anthropic's ``message``."""
    calls = done.tool_calls()
    content: list[a.TextBlockOut | a.ToolUseOut] = []
    text = done.text
    if text or not calls:
        content.append(a.TextBlockOut(text))
    content += [
        a.ToolUseOut(c.id or new_id("toolu_"), c.name, tool_input(c.arguments)) for c in calls
    ]
    finish = done.finish
    reason = stop_reason(finish, bool(calls))
    return a.AnthropicMessage(
        id=ident,
        role="assistant",
        model=model,
        content=content,
        stop_reason=reason,
        stop_sequence=finish.stop_sequence
        if finish is not None and reason == "stop_sequence"
        else None,
        usage=usage(finish),
    )


def usage(finish: Finish | None) -> a.MessageUsage:
    if finish is None:
        return a.MessageUsage(input_tokens=0, output_tokens=0)
    cached = finish.cached_tokens
    return a.MessageUsage(
        input_tokens=finish.prompt_tokens - (cached or 0),
        output_tokens=finish.completion_tokens,
        cache_read_input_tokens=cached,
    )
