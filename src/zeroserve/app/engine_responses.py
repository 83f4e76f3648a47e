"""``POST /v1/responses`` for engine-backed (``llamacpp``) models: the Responses API,
stateless, translated to the engine's chat completions.

Strategy (docs/architecture.md, "The Responses API")
----------------------------------------------------
``xllamacpp.Server`` has no Responses handler (llama.cpp's own ``/v1/responses`` lives
only on its HTTP server, the side door zeroserve keeps locked), so the request is
translated here, once, into a chat completion for ``handle_chat_completions``:

* ``instructions`` becomes the first (system) message, ``input`` the conversation (a
  string is one user message; text parts are joined with newlines; ``developer`` is
  ``system``, which chat templates know); without either, the model's default system
  prompt applies, as on chat;
* an agent loop's ``function_call`` items (an earlier answer's calls sent back) become
  an assistant message with ``tool_calls`` (consecutive calls, and the assistant
  message just before them, are one message), each ``function_call_output`` a ``tool``
  message;
* ``max_output_tokens``, ``temperature`` and ``top_p`` keep their meaning;
  ``text.format`` becomes ``response_format`` (grammar-enforced by the engine);
* ``tools`` of type ``function`` (flat: ``name``, ``parameters``... at the top) become
  chat's tools (under ``function``), ``tool_choice`` chat's (``{"type": "function",
  "name"}`` becomes ``{"type": "function", "function": {"name"}}``, and ``allowed_tools``
  ``{"mode", "tools"}`` chat's ``{"allowed_tools": {"mode", "tools"}}``), and the chat
  request goes through the chat path's own tool plans (``engine_tools.plan_tools``):
  a forced call (``required`` or a named function) is grammar-constrained, ``auto``
  uses the model's native tool template or the generic format, ``none`` answers text.
  ``max_tool_calls`` and ``parallel_tool_calls: false`` bound the generic format's
  grammar (a forced answer is one call); tools of any other type are a 400 naming the
  type, and ``max_tool_calls`` with a native template (which decides how many calls it
  makes) a 400 naming it;
* parameters that need state (``previous_response_id``, ``store: true``, ...) or that
  the engine cannot honour get a 400 naming them (``openai/responses.py``).

The engine's answer comes back as chat chunks (streamed from the engine even for a whole
answer, so that a deadline or a client that leaves stops the slot at the next token);
each is decoded once, with msgspec, and turned into OpenAI's Responses shapes: a whole
``response`` object (from the answer ``engine_answers.collect`` assembles), or the stream's
events in OpenAI's exact order and format (``event: <type>`` and ``data: <json>``,
``sequence_number`` from 0): ``response.created``, ``response.in_progress``,
``response.output_item.added``, ``response.content_part.added``, one
``response.output_text.delta`` per engine chunk, then ``response.output_text.done``,
``response.content_part.done``, ``response.output_item.done`` and
``response.completed`` (``response.incomplete`` when ``max_output_tokens`` cut it). A
call is a ``function_call`` output item (``call_id``, ``name``, ``arguments``): streamed
as ``response.output_item.added`` (``arguments: ""``), one
``response.function_call_arguments.delta`` per fragment, ``...arguments.done`` and
``response.output_item.done``. A forced call of one tool streams its arguments as the
engine makes them; with several tools, or in the generic format, the call is known only
when its object is complete, and is sent then (one delta). With tools that may or may
not be called, the message item opens only when the answer turns out to be text. A
failure after the first event is an ``error`` event, and the stream ends.
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import AsyncGenerator
from typing import Any, Literal, Protocol, TypeVar

import msgspec

from ..errors import RequestError, ZeroserveError
from .engine_answers import Collected, collect
from .engine_tools import (
    AutoTool,
    ForcedTool,
    GeneratedPieces,
    NativeTools,
    ToolEngine,
    chat_function,
    chat_tool,
    plan_tools,
)
from .openai import responses as r
from .openai import schemas as s
from .response import EVENT_STREAM, JSON, Response, StreamResponse

T = TypeVar("T")
_encode = msgspec.json.encode
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


class ResponsesCall(Protocol):
    """What a Responses answer needs of one engine call (``engine_relay._Run``)."""

    complete: bool

    @property
    def model(self) -> str: ...

    @property
    def timings(self) -> s.EngineTimings | None: ...

    def check(self, chunk: bytes) -> bytes: ...

    async def next_chunk(self) -> bytes | None: ...

    def close(self) -> None: ...


Choice = Literal["auto", "none", "required"] | r.FunctionChoice | r.AllowedChoice


class Translated(msgspec.Struct, kw_only=True):
    """A Responses request as a chat completion for the engine."""

    body: bytes  # the engine's chat request
    messages: list[s.EngineMessage]  # its conversation (for an exact token count)
    bound: int  # an upper bound of the prompt's tokens: its UTF-8 bytes
    error_param: str | None  # what an engine refusal names (the tools, the schema)
    plan: ForcedTool | AutoTool | None  # a forced call, or the generic format
    tools: list[r.FunctionToolIn]  # the function tools (echoed in the answer)
    choice: Choice  # the tool choice (echoed)


def decode_request(body: memoryview) -> r.ResponsesRequest:
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


def translate(
    req: r.ResponsesRequest, alias: str, system_prompt: str | None, engine: ToolEngine
) -> Translated:
    """The engine's chat request for ``req`` (``model`` set to ``alias``)."""
    messages: list[s.EngineMessage] = []
    if req.instructions is not None:
        messages.append(s.EngineMessage(role="system", content=req.instructions))
    if isinstance(req.input, str):
        messages.append(s.EngineMessage(role="user", content=req.input))
    else:
        for i, item in enumerate(req.input):
            _add_item(messages, item, i)
    tools = _function_tools(req.tools or [])
    choice = _tool_choice(req.tool_choice)
    fmt = req.text.format if req.text is not None else None
    response_format = (
        msgspec.Raw(_encode(_response_format(fmt)))
        if fmt is not None and fmt.type != "text"
        else msgspec.UNSET
    )
    chat_tools = [_chat_tool(t) for t in tools]
    chat = s.EngineChatRequest(
        model=alias,
        messages=messages,
        max_tokens=req.max_output_tokens,
        temperature=req.temperature,
        top_p=req.top_p,
        # Streamed from the engine, whole answers too, as every engine request is
        # (app/engine_answers.py: each chunk's callback can stop the slot). The usage
        # comes in the last chunk.
        stream=True,
        stream_options=s.StreamOptions(include_usage=True),
        response_format=response_format,
        tools=msgspec.Raw(_encode(chat_tools)) if tools else msgspec.UNSET,
        tool_choice=msgspec.Raw(_encode(_chat_choice(choice)))
        if tools or choice != "auto"
        else msgspec.UNSET,
        parallel_tool_calls=req.parallel_tool_calls,
    )
    try:
        planned = plan_tools(chat, engine, max_calls=req.max_tool_calls)
    except RequestError as exc:
        exc.param = _responses_param(exc.param)
        raise
    native = planned if isinstance(planned, NativeTools) else None
    plan = None if isinstance(planned, NativeTools) else planned
    if plan is None and tools and choice != "none" and req.max_tool_calls is not None:
        raise RequestError(
            "max_tool_calls is not supported with this model's native tool calls",
            param="max_tool_calls",
        )
    if plan is None and system_prompt is not None and not any(m.role == "system" for m in messages):
        messages.insert(0, s.EngineMessage(role="system", content=system_prompt))
    if plan is not None:
        body = plan.body
    else:
        out: dict[str, Any] = {
            "model": alias,
            "messages": messages,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        if req.max_output_tokens is not None:
            out["max_tokens"] = req.max_output_tokens
        if req.temperature is not None:
            out["temperature"] = req.temperature
        if req.top_p is not None:
            out["top_p"] = req.top_p
        if s.given(response_format):
            out["response_format"] = response_format
        if native is not None:  # the allowed tools only, the template choosing
            out["tools"] = [chat_tool(t) for t in native.tools]
            out["tool_choice"] = "auto"
        elif tools:
            out["tools"] = chat_tools
            out["tool_choice"] = _chat_choice(choice)
            if req.parallel_tool_calls is not None:
                out["parallel_tool_calls"] = req.parallel_tool_calls
        body = _encode(out)
    bound = sum(_message_bytes(m) for m in messages)
    bound += sum(len(raw) for raw in req.tools or ())
    error_param = "tools" if tools else "text.format" if s.given(response_format) else None
    return Translated(
        body=body,
        messages=messages,
        bound=bound,
        error_param=error_param,
        plan=plan,
        tools=tools,
        choice=choice,
    )


def _add_item(messages: list[s.EngineMessage], item: r.InputItem, i: int) -> None:
    """``item`` (the ``i``-th input item) as the chat message it is part of."""
    _check_type(item.type, i)
    for field in _REQUIRED[item.type]:
        if msgspec.structs.asdict(item)[field] is None:
            raise RequestError(
                f"an input item of type {item.type!r} needs {field!r}", param=f"input[{i}].{field}"
            )
    if item.type == "message":
        assert item.role is not None and item.content is not None
        messages.append(
            s.EngineMessage(
                role=_ROLES.get(item.role, item.role), content=_text(item.content, i, "content")
            )
        )
    elif item.type == "function_call":
        assert item.call_id is not None and item.name is not None and item.arguments is not None
        call = s.ToolCallIn(
            id=item.call_id,
            function=s.ToolCallFunction(name=item.name, arguments=item.arguments),
        )
        last = messages[-1] if messages else None
        if last is not None and last.role == "assistant":
            # The same turn: the text before the calls, or the calls before this one.
            last.tool_calls = [*(last.tool_calls or ()), call]
        else:
            messages.append(s.EngineMessage(role="assistant", tool_calls=[call]))
    else:
        assert item.output is not None
        messages.append(
            s.EngineMessage(
                role="tool", tool_call_id=item.call_id, content=_text(item.output, i, "output")
            )
        )


def _text(content: str | list[r.InputPart], i: int, field: str) -> str:
    if isinstance(content, str):
        return content
    texts: list[str] = []
    for j, part in enumerate(content):
        if part.type not in _TEXT_PARTS or part.text is None:
            raise RequestError(
                "only text content parts (input_text, output_text) are supported",
                param=f"input[{i}].{field}[{j}]",
            )
        texts.append(part.text)
    return "\n".join(texts)


def _message_bytes(m: s.EngineMessage) -> int:
    n = len(m.content.encode()) if isinstance(m.content, str) else 0
    for c in m.tool_calls or ():
        n += len(c.function.name.encode()) + len(c.function.arguments.encode())
    return n


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
        kind = _decode(r.tool_type_decoder, t, f"tools[{i}]").type
        if kind != "function":
            # Named when it is a type's name (an error body never echoes other input).
            named = repr(kind) if _TYPE_NAME.fullmatch(kind) else "(value not shown)"
            raise RequestError(
                f"tools of type {named} are not supported; only 'function' tools are",
                param=f"tools[{i}].type",
            )
        tools.append(_decode(r.function_tool_decoder, t, f"tools[{i}]"))
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


def _decode(decoder: msgspec.json.Decoder[T], raw: msgspec.Raw, param: str) -> T:
    """``raw`` (the value of ``param``) decoded, or a 400 naming the field within it."""
    try:
        return s.decode(decoder, memoryview(raw))
    except RequestError as exc:
        inner = exc.param
        exc.param = param if not inner else param + ("" if inner[0] == "[" else ".") + inner
        raise


def _chat_tool(t: r.FunctionToolIn) -> dict[str, Any]:
    """A Responses function tool (flat) as chat's ``tools`` write it."""
    return chat_function(t.name, t.description, t.parameters, t.strict)


def _chat_choice(choice: Choice) -> Any:
    if isinstance(choice, r.FunctionChoice):
        return {"type": "function", "function": {"name": choice.name}}
    if isinstance(choice, r.AllowedChoice):
        allowed = [{"type": "function", "function": {"name": c.name}} for c in choice.tools]
        return {"type": "allowed_tools", "allowed_tools": {"mode": choice.mode, "tools": allowed}}
    return choice


def _responses_param(param: str | None) -> str | None:
    """A chat parameter's name (what the tool plans name) as the Responses API's."""
    if param is None:
        return None
    if param.startswith("response_format"):
        return "text.format"
    return param.replace(".function.", ".", 1) if param.startswith("tools[") else param


def _response_format(fmt: r.TextFormat) -> dict[str, Any]:
    if fmt.type == "json_object":
        return {"type": "json_object"}
    if not s.given(fmt.schema):
        raise RequestError(
            "text.format of type json_schema needs a schema", param="text.format.schema"
        )
    if len(fmt.schema) > s.MAX_RESPONSE_FORMAT_BYTES:
        raise RequestError(
            f"text.format.schema is {len(fmt.schema)} bytes; the limit is "
            f"{s.MAX_RESPONSE_FORMAT_BYTES}",
            param="text.format.schema",
        )
    schema: dict[str, Any] = {"name": fmt.name or "response", "schema": fmt.schema}
    if fmt.strict is not None:
        schema["strict"] = fmt.strict
    return {"type": "json_schema", "json_schema": schema}


Status = Literal["in_progress", "completed", "incomplete"]


class ResponsesAnswer:
    """One Responses answer over one engine call: the whole object, or its events."""

    def __init__(self, req: r.ResponsesRequest, t: Translated) -> None:
        self.req = req
        self.plan = t.plan
        self.choice = t.choice
        self.tools = [
            r.FunctionToolOut(
                name=x.name,
                description=x.description,
                parameters=x.parameters if s.given(x.parameters) else None,
                strict=x.strict,
            )
            for x in t.tools
        ]
        # Whether the answer may be a call: then a message item opens only for text.
        self.may_call = bool(t.tools) and t.choice != "none"
        self.ident = "resp_" + os.urandom(24).hex()
        self.created = int(time.time())
        self.seq = 0
        # The stream's output items: those done, and the one open (if any).
        self.items: list[r.OutputItem] = []
        self.open: r.OutputMessage | r.FunctionCallOut | None = None
        self.parts: list[str] = []  # the open item's text or arguments

    def _snapshot(
        self,
        model: str,
        status: Any,
        output: list[r.OutputItem],
        usage: r.ResponseUsage | None = None,
        incomplete: bool = False,
        error: r.ResponseError | None = None,
    ) -> r.ResponseObject:
        req = self.req
        fmt = req.text.format if req.text is not None else None
        fmt_out = (
            r.FormatOut(type="text")
            if fmt is None
            else r.FormatOut(
                type=fmt.type,
                name=fmt.name if fmt.name is not None else msgspec.UNSET,
                description=fmt.description if fmt.description is not None else msgspec.UNSET,
                schema=fmt.schema,
                strict=fmt.strict if fmt.strict is not None else msgspec.UNSET,
            )
        )
        return r.ResponseObject(
            id=self.ident,
            created_at=self.created,
            status=status,
            error=error,
            incomplete_details=r.IncompleteDetails(reason="max_output_tokens")
            if incomplete
            else None,
            instructions=req.instructions,
            max_output_tokens=req.max_output_tokens,
            max_tool_calls=req.max_tool_calls,
            model=model,
            output=output,
            parallel_tool_calls=req.parallel_tool_calls is not False,
            prompt_cache_key=req.prompt_cache_key,
            safety_identifier=req.safety_identifier,
            temperature=1.0 if req.temperature is None else req.temperature,
            text=r.TextOut(format=fmt_out),
            tool_choice=self.choice,
            tools=self.tools,
            top_p=1.0 if req.top_p is None else req.top_p,
            usage=usage,
            user=req.user,
            metadata=req.metadata or {},
        )

    @staticmethod
    def _message(text: str, status: Status) -> r.OutputMessage:
        return r.OutputMessage(
            id="msg_" + os.urandom(24).hex(), status=status, content=[r.OutputText(text=text)]
        )

    @staticmethod
    def _call(call_id: str, name: str, arguments: str, status: Status) -> r.FunctionCallOut:
        return r.FunctionCallOut(
            id="fc_" + os.urandom(24).hex(),
            status=status,
            call_id=call_id,
            name=name,
            arguments=arguments,
        )

    def _output(self, answer: Collected, status: Status) -> list[r.OutputItem]:
        """The whole answer's output items: its calls, or its message."""
        plan = self.plan
        if isinstance(plan, ForcedTool):
            name, args = plan.call(answer.text)
            return [self._call(plan.call_id, name, args, status)]
        if isinstance(plan, AutoTool):
            calls = plan.calls(answer.text)
            if calls is None:
                return [self._message(answer.text, status)]
            return [self._call(c.id, c.function.name, c.function.arguments, status) for c in calls]
        native = answer.tool_calls()  # the model's own tool template made them
        items: list[r.OutputItem] = []
        if answer.parts or not native:
            items.append(self._message(answer.text, status))
        items += [self._call(c.id, c.function.name, c.function.arguments, status) for c in native]
        return items

    @staticmethod
    def _usage(usage: s.EngineUsage | None, timings: s.EngineTimings | None) -> r.ResponseUsage:
        u = usage or s.EngineUsage()
        cached = timings.cache_n if timings is not None else 0
        written = timings.prompt_n if timings is not None else 0
        return r.ResponseUsage(
            input_tokens=u.prompt_tokens,
            input_tokens_details=r.InputTokensDetails(
                cached_tokens=cached, cache_write_tokens=written
            ),
            output_tokens=u.completion_tokens,
            output_tokens_details=r.OutputTokensDetails(),
            total_tokens=u.prompt_tokens + u.completion_tokens,
        )

    async def respond(
        self, run: ResponsesCall, first: bytes, *, chat: bool, stream: bool
    ) -> Response | StreamResponse:
        model = run.model
        if not stream:
            # A deadline, an engine error or the client gone: ``collect`` stops the slot.
            answer = await collect(run, first)
            cut = answer.finish_reason == "length"
            status: Status = "incomplete" if cut else "completed"
            out = self._snapshot(
                model,
                status,
                self._output(answer, status),
                self._usage(answer.usage, run.timings),
                incomplete=cut,
            )
            return Response(200, [_encode(out)], content_type=JSON)
        return StreamResponse(
            GeneratedPieces(self._events(run, first, model), run.close),
            framing="chunked",
            content_type=EVENT_STREAM,
            headers=[(b"cache-control", b"no-cache")],
        )

    # -- the stream's events ---------------------------------------------------------------
    def _event(self, event: r.ResponseEvent) -> bytes:
        """One SSE event as OpenAI writes it: ``event: <type>`` then the data line."""
        self.seq += 1
        return b"event: %s\ndata: %s\n\n" % (event.type.encode(), _encode(event))

    def _open_message(self) -> list[bytes]:
        item = r.OutputMessage(id="msg_" + os.urandom(24).hex(), status="in_progress", content=[])
        self.open, self.parts = item, []
        index = len(self.items)
        return [
            self._event(
                r.OutputItemEvent(
                    type="response.output_item.added",
                    sequence_number=self.seq,
                    output_index=index,
                    item=item,
                )
            ),
            self._event(
                r.ContentPartEvent(
                    type="response.content_part.added",
                    sequence_number=self.seq,
                    item_id=item.id,
                    output_index=index,
                    content_index=0,
                    part=r.OutputText(text=""),
                )
            ),
        ]

    def _open_call(self, call_id: str, name: str) -> bytes:
        item = self._call(call_id, name, "", "in_progress")
        self.open, self.parts = item, []
        return self._event(
            r.OutputItemEvent(
                type="response.output_item.added",
                sequence_number=self.seq,
                output_index=len(self.items),
                item=item,
            )
        )

    def _delta(self, text: str) -> list[bytes]:
        """``text`` added to the open item (a message is opened for text if none is)."""
        out = [] if isinstance(self.open, r.OutputMessage) else self._close("completed")
        if self.open is None:
            out += self._open_message()
        item, index = self.open, len(self.items)
        assert item is not None
        self.parts.append(text)
        if isinstance(item, r.OutputMessage):
            event: r.ResponseEvent = r.TextDeltaEvent(
                sequence_number=self.seq,
                item_id=item.id,
                output_index=index,
                content_index=0,
                delta=text,
            )
        else:
            event = r.ArgumentsDeltaEvent(
                sequence_number=self.seq, item_id=item.id, output_index=index, delta=text
            )
        out.append(self._event(event))
        return out

    def _args(self, text: str) -> list[bytes]:
        """``text`` added to the open call's arguments."""
        item = self.open
        assert isinstance(item, r.FunctionCallOut)
        self.parts.append(text)
        return [
            self._event(
                r.ArgumentsDeltaEvent(
                    sequence_number=self.seq,
                    item_id=item.id,
                    output_index=len(self.items),
                    delta=text,
                )
            )
        ]

    def _close(self, status: Status) -> list[bytes]:
        """The open item's done events (nothing if none is open)."""
        item, index = self.open, len(self.items)
        if item is None:
            return []
        text = "".join(self.parts)
        out: list[bytes] = []
        done: r.OutputItem
        if isinstance(item, r.OutputMessage):
            part = r.OutputText(text=text)
            out.append(
                self._event(
                    r.TextDoneEvent(
                        sequence_number=self.seq,
                        item_id=item.id,
                        output_index=index,
                        content_index=0,
                        text=text,
                    )
                )
            )
            out.append(
                self._event(
                    r.ContentPartEvent(
                        type="response.content_part.done",
                        sequence_number=self.seq,
                        item_id=item.id,
                        output_index=index,
                        content_index=0,
                        part=part,
                    )
                )
            )
            done = msgspec.structs.replace(item, status=status, content=[part])
        else:
            out.append(
                self._event(
                    r.ArgumentsDoneEvent(
                        sequence_number=self.seq,
                        item_id=item.id,
                        output_index=index,
                        arguments=text,
                    )
                )
            )
            done = msgspec.structs.replace(item, status=status, arguments=text)
        out.append(
            self._event(
                r.OutputItemEvent(
                    type="response.output_item.done",
                    sequence_number=self.seq,
                    output_index=index,
                    item=done,
                )
            )
        )
        self.items.append(done)
        self.open, self.parts = None, []
        return out

    def _whole_call(self, call_id: str, name: str, arguments: str, status: Status) -> list[bytes]:
        """A call known only once complete: its events, one arguments delta."""
        out = self._close(status)
        out.append(self._open_call(call_id, name))
        out += self._args(arguments)
        return out + self._close(status)

    async def _events(
        self, run: ResponsesCall, first: bytes, model: str
    ) -> AsyncGenerator[bytes, None]:
        ev, plan = self._event, self.plan
        for kind in ("response.created", "response.in_progress"):
            yield ev(
                r.LifecycleEvent(
                    type=kind,
                    sequence_number=self.seq,
                    response=self._snapshot(model, "in_progress", []),
                )
            )
        if isinstance(plan, ForcedTool) and plan.single is not None:
            yield self._open_call(plan.call_id, plan.single)  # arguments follow as made
        elif not self.may_call:
            for e in self._open_message():
                yield e
        held: list[str] = []  # a call's text, known whole only at the end
        deciding = isinstance(plan, AutoTool)  # until the first character: text or call?
        reason = "stop"
        usage: s.EngineUsage | None = None
        chunk: bytes | None = first
        try:
            while chunk is not None:
                data = s.engine_chunk_decoder.decode(run.check(chunk))
                if data.usage is not None:
                    usage = data.usage
                for c in data.choices:
                    d = c.delta
                    if c.finish_reason is not None:
                        reason = c.finish_reason
                    if d is None:
                        continue
                    text = d.content
                    if text and isinstance(plan, ForcedTool):
                        if plan.single is not None:
                            for e in self._args(text):
                                yield e
                        else:
                            held.append(text)
                    elif text and deciding:
                        held.append(text)
                        lead = "".join(held).lstrip()
                        if lead:
                            deciding = False
                            if not lead.startswith("{"):  # text: sent from here on
                                text, held = "".join(held), []
                                for e in self._delta(text):
                                    yield e
                    elif text and held:  # the generic format's call, still coming
                        held.append(text)
                    elif text:
                        for e in self._delta(text):
                            yield e
                    for t in d.tool_calls or ():  # a native template's call
                        f = t.function
                        if t.id is not None or (f is not None and f.name):
                            for e in self._close("completed"):
                                yield e
                            yield self._open_call(t.id or "", f.name or "" if f else "")
                        if f is not None and f.arguments and self.open is not None:
                            for e in self._args(f.arguments):
                                yield e
                chunk = await run.next_chunk()
        except ZeroserveError as exc:
            # The head is sent: the failure is an event (OpenAI's ``error``), then the end.
            yield ev(
                r.ErrorEvent(
                    sequence_number=self.seq, code=exc.code, message=str(exc), param=exc.param
                )
            )
            return
        cut = reason == "length"
        status: Status = "incomplete" if cut else "completed"
        out: list[bytes] = []
        if isinstance(plan, ForcedTool) and plan.single is None:
            name, args = plan.call("".join(held))
            out += self._whole_call(plan.call_id, name, args, status)
        elif held and isinstance(plan, AutoTool):
            content = "".join(held)
            calls = plan.calls(content)
            if calls is None:  # a call cut short by max_output_tokens: the text it is
                out += self._delta(content)
            for call in calls or ():
                out += self._whole_call(
                    call.id, call.function.name, call.function.arguments, status
                )
        if self.open is None and not self.items and not out:
            out += self._open_message()  # an empty answer is an empty message
        out += self._close(status)
        for e in out:
            yield e
        final = self._snapshot(
            model, status, self.items, self._usage(usage, run.timings), incomplete=cut
        )
        yield ev(
            r.LifecycleEvent(type=f"response.{status}", sequence_number=self.seq, response=final)
        )
