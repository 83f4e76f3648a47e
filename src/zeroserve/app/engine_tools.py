"""``response_format`` and ``tools`` for engine-backed models (``app.engine_relay``).

Strategy (docs/architecture.md, "The in-process engine")
--------------------------------------------------------
``response_format`` (``json_object``, ``json_schema`` with ``strict``) goes to the engine
as it came, after two checks here: its size (``MAX_RESPONSE_FORMAT_BYTES``, before any
grammar is compiled from it) and its shape. The engine compiles the schema into a grammar
and refuses one that is not valid JSON Schema (a 400 naming ``response_format``).

``tools`` with ``tool_choice`` ``"required"`` or a named function must always produce a
valid call, whatever the model's chat template knows about tools (SmolLM2's knows
nothing). So the request is rewritten for the engine: the tools leave the body, a system
message describes them, and a ``json_schema`` response format constrains the answer by
grammar: the function's ``parameters`` (one tool) or ``{"name", "arguments"}`` with one
branch per tool (several). The engine's answer is then turned into OpenAI's
``tool_calls``, non-streamed, or streamed as OpenAI's exact deltas: a first delta with
the call's ``id``, ``type`` and ``function.name`` and ``arguments: ""``, then argument
fragments as the engine makes them (one tool; with several the name is known only at
the end, so the call is sent whole at the end), then ``finish_reason: "tool_calls"``.
``tool_choice`` ``allowed_tools`` (``{"mode", "tools"}``) narrows the tools the plan offers
to the allowed ones (the system message and the grammar name only those; ``tools``
itself may list more) and then plans as its ``mode`` says: ``required`` as
``"required"``, ``auto`` as ``"auto"``; with a native template the engine gets only the
allowed tools and ``"auto"`` (``NativeTools``). A name that is not in ``tools`` is a 400
naming ``tool_choice``. ``tool_choice`` ``"none"`` goes to the engine unchanged. ``"auto"`` (or absent) goes
unchanged too when the model's chat template has native tool calls (the engine reports
it: ``LlamaCppModel.native_tools``); the engine renders the tools and parses the calls.
Otherwise the request is rewritten into the generic format (docs/models.md, "Tools with
tool_choice auto"): a system message describes the tools and asks for either a plain
text answer or one JSON object ``{"tool_calls": [{"name": ..., "arguments": {...}}]}``,
and a grammar allows exactly those two: the call object is the same per-tool schema the
forced path uses (compiled by the engine's own converter), the text is anything that
does not start with ``{``. An answer that starts with ``{`` is a call and becomes OpenAI's
``tool_calls`` (streamed: held until the object is complete, then sent whole, one delta
per call); any other answer is an ordinary message, streamed as it comes.
``parallel_tool_calls: false`` (and the Responses API's ``max_tool_calls``) bound the
call object's ``tool_calls`` by the grammar (``maxItems``). ``/v1/responses`` uses these
same plans (``engine_responses``: its request translated to a chat request first, the
plan's ``call``/``calls`` read back into ``function_call`` items).

``n`` > 1 (``engine_relay.run_choices``): the engine decodes one sequence per request,
so each choice is its own engine request (with ``seed + j`` when a seed is given). A whole answer runs them concurrently
and merges the choices; a stream runs them one after another (as the generic OpenAI
path does) and renumbers each chunk's choice ``index``.
"""

from __future__ import annotations

import os
import time
from collections.abc import AsyncGenerator, Awaitable, Callable
from typing import Any, Protocol

import msgspec

from ..errors import RequestError, ZeroserveError
from .engine_answers import collect
from .openai import schemas as s
from .response import JSON, Response, StreamResponse


class ToolEngine(Protocol):
    """What the tool plans need of the serving model (``LlamaCppModel``)."""

    @property
    def native_tools(self) -> bool: ...

    def schema_grammar(self, schema: bytes) -> str: ...


class EngineCall(Protocol):
    """What a tool answer needs of one engine call (``engine_relay._Run``)."""

    @property
    def model(self) -> str: ...

    def check(self, chunk: bytes) -> bytes: ...

    async def next_chunk(self) -> bytes | None: ...

    def close(self) -> None: ...


_encode = msgspec.json.encode
_NO_PARAMETERS = b'{"type":"object"}'


def check_response_format(raw: msgspec.Raw | msgspec.UnsetType) -> s.ResponseFormat | None:
    if not s.given(raw):
        return None
    if len(raw) > s.MAX_RESPONSE_FORMAT_BYTES:
        raise RequestError(
            f"response_format is {len(raw)} bytes; the limit is {s.MAX_RESPONSE_FORMAT_BYTES}",
            param="response_format",
        )
    fmt = s.decode(s.response_format_decoder, memoryview(bytes(raw)))
    if fmt.type == "json_schema" and (
        fmt.json_schema is None or not s.given(fmt.json_schema.schema)
    ):
        raise RequestError(
            "response_format of type json_schema needs json_schema.schema",
            param="response_format.json_schema.schema",
        )
    return fmt


def plan_tools(
    body: s.EngineChatRequest, engine: ToolEngine, *, max_calls: int | None = None
) -> ForcedTool | AutoTool | NativeTools | None:
    """Check ``response_format``, ``tools`` and ``tool_choice``; a plan when the answer
    must be a forced tool call or may be one in the generic format, the allowed tools
    when a native template is to choose among some of ``tools`` only, else None (the
    body goes to the engine as it came). ``max_calls`` bounds the calls of one answer
    (the Responses API's ``max_tool_calls``); ``parallel_tool_calls: false`` bounds it
    to 1."""
    fmt = check_response_format(body.response_format)
    choice: Any = None
    if s.given(body.tool_choice):
        choice = _decode_param(s.tool_choice_decoder, body.tool_choice, "tool_choice")
    if not s.given(body.tools):
        if choice is not None and choice != "none":
            raise RequestError("tool_choice needs tools", param="tool_choice")
        return None
    if len(body.tools) > s.MAX_TOOLS_BYTES:
        raise RequestError(
            f"tools is {len(body.tools)} bytes; the limit is {s.MAX_TOOLS_BYTES}", param="tools"
        )
    tools = _decode_param(s.tools_decoder, body.tools, "tools")
    if not tools:
        raise RequestError("tools must not be empty", param="tools")
    names = [t.function.name for t in tools]
    if len(set(names)) != len(names):
        raise RequestError("tool names must be unique", param="tools")
    restricted = isinstance(choice, s.AllowedToolChoice)
    if restricted:
        tools = allowed(tools, [c.function.name for c in choice.allowed_tools.tools])
        choice = choice.allowed_tools.mode
    if isinstance(choice, s.NamedToolChoice):
        chosen = [t for t in tools if t.function.name == choice.function.name]
        if not chosen:
            raise RequestError(
                "tool_choice names a function that is not in tools", param="tool_choice"
            )
    elif choice == "required":
        chosen = tools
    elif choice == "none":
        return None  # the engine answers text
    elif engine.native_tools:
        # The engine and its template decide, among the allowed tools only.
        return NativeTools(tools) if restricted else None
    else:  # "auto" or absent, on a template without tools: the generic format
        if fmt is not None:
            raise RequestError(
                "response_format cannot be combined with tools on this model",
                param="response_format",
            )
        if (body.n or 1) > 1:
            raise RequestError("n > 1 is not supported with tools on this model", param="n")
        if body.parallel_tool_calls is False:
            max_calls = 1
        return AutoTool(body, tools, engine, max_calls)
    if fmt is not None:
        raise RequestError(
            "response_format cannot be combined with a forced tool_choice", param="response_format"
        )
    if (body.n or 1) > 1:
        raise RequestError("n > 1 is not supported with a forced tool_choice", param="n")
    return ForcedTool(body, chosen)


def allowed(tools: list[s.Tool], names: list[str]) -> list[s.Tool]:
    """The tools of ``tools`` that ``names`` (an ``allowed_tools`` choice) allows, in
    ``tools``' order; a name that is not a tool's is a 400 naming ``tool_choice``."""
    known = {t.function.name for t in tools}
    for name in names:
        if name not in known:
            raise RequestError(
                "tool_choice allows a function that is not in tools", param="tool_choice"
            )
    wanted = set(names)
    return [t for t in tools if t.function.name in wanted]


def chat_tool(t: s.Tool) -> dict[str, Any]:
    """``t`` as chat's ``tools`` write it, with only the fields it was given."""
    f = t.function
    return chat_function(f.name, f.description, f.parameters, f.strict)


def chat_function(
    name: str, description: str | None, parameters: Any, strict: bool | None
) -> dict[str, Any]:
    """A function tool as chat's ``tools`` write it, with only the fields given
    (``parameters`` unset: ``msgspec.UNSET``)."""
    function: dict[str, Any] = {"name": name}
    if description is not None:
        function["description"] = description
    if s.given(parameters):
        function["parameters"] = parameters
    if strict is not None:
        function["strict"] = strict
    return {"type": "function", "function": function}


class NativeTools:
    """``allowed_tools`` in mode ``auto`` on a template with native tool calls: the
    engine gets only the allowed ``tools``, with ``tool_choice: "auto"`` (its template
    renders them and parses the calls; the engine knows no ``allowed_tools``)."""

    __slots__ = ("tools",)

    def __init__(self, tools: list[s.Tool]) -> None:
        self.tools = tools

    def tools_json(self) -> bytes:
        return _encode([chat_tool(t) for t in self.tools])


def _decode_param(decoder: msgspec.json.Decoder[Any], raw: msgspec.Raw, param: str) -> Any:
    try:
        return decoder.decode(raw)
    except msgspec.ValidationError as exc:
        where = str(exc).rpartition(" - at `$")[2].rstrip("`")
        raise RequestError(
            f"invalid parameter '{param}': {str(exc).split(' - at ')[0]}", param=param + where
        ) from None


def _tool_text(
    tools: list[s.Tool],
    instructions: str = "Answer with the function's arguments as JSON.",
    intro: str = "You call a function to answer.",
) -> str:
    lines = [intro + " The functions:"]
    for t in tools:
        f = t.function
        params = (
            bytes(f.parameters).decode()
            if f.parameters is not None and s.given(f.parameters)
            else "{}"
        )
        lines.append(f"- {f.name}: {f.description or ''} Parameters (JSON Schema): {params}")
    lines.append(instructions)
    return "\n".join(lines)


def _parameters(tool: s.Tool) -> Any:
    p = tool.function.parameters
    return msgspec.json.decode(bytes(p)) if p is not None and s.given(p) else {"type": "object"}


def call_schema(tools: list[s.Tool]) -> Any:
    """The JSON Schema of one call ``{"name", "arguments"}`` of any of ``tools``: one
    branch per tool, its name a constant and its arguments the function's parameters."""
    return {
        "anyOf": [
            {
                "type": "object",
                "properties": {"name": {"const": t.function.name}, "arguments": _parameters(t)},
                "required": ["name", "arguments"],
            }
            for t in tools
        ]
    }


_FORWARDED = (
    "max_tokens",
    "max_completion_tokens",
    "temperature",
    "top_p",
    "seed",
    "presence_penalty",
    "frequency_penalty",
    "logit_bias",
    "stop",
)


def engine_body(body: s.EngineChatRequest, system: str, constraint: dict[str, Any]) -> bytes:
    """The request for the engine: ``system`` first, the conversation in plain messages
    (no tools: the template knows none), the sampling fields, and ``constraint`` (a
    ``response_format`` or a ``grammar``)."""
    messages: list[Any] = [{"role": "system", "content": system}]
    messages += [msgspec.structs.asdict(m) for m in body.messages]
    for m in messages:
        for key in [k for k, v in m.items() if v is None]:
            del m[key]
        calls = m.get("tool_calls")
        if calls:
            m["tool_calls"] = [msgspec.structs.asdict(c) for c in calls]
            for c in m["tool_calls"]:
                c["function"] = msgspec.structs.asdict(c["function"])
        content = m.get("content")
        if isinstance(content, list):
            m["content"] = "\n".join(p.text or "" for p in content)
    out: dict[str, Any] = {"model": body.model, "messages": messages, "stream": bool(body.stream)}
    out.update(constraint)
    for key in _FORWARDED:
        value = getattr(body, key)
        if value is not None:
            out[key] = value
    if body.stream_options is not None:
        out["stream_options"] = {"include_usage": body.stream_options.include_usage}
    return _encode(out)


class _ToolAnswer:
    """What both tool plans share: the answer's identity and its chunks' shape."""

    include_usage: bool
    ident: str
    created: int

    def _chunk(self, model: str, delta: s.ToolDelta, reason: str | None, usage: Any) -> bytes:
        return _encode(
            s.ToolChunk(
                self.ident,
                "chat.completion.chunk",
                self.created,
                model,
                [s.ToolChunkChoice(0, delta, None, reason)],
                usage,
            )
        )

    def _usage_chunk(self, model: str, usage: s.Usage) -> bytes:
        return _encode(
            s.ToolChunk(self.ident, "chat.completion.chunk", self.created, model, [], usage)
        )


class ForcedTool(_ToolAnswer):
    """A request whose answer must be a call of one of ``tools`` (grammar-constrained)."""

    def __init__(self, body: s.EngineChatRequest, tools: list[s.Tool]) -> None:
        self.tools = tools
        self.single = tools[0].function.name if len(tools) == 1 else None
        self.include_usage = bool(body.stream_options and body.stream_options.include_usage)
        if self.single is not None:
            p = tools[0].function.parameters
            schema = (
                msgspec.Raw(bytes(p))
                if p is not None and s.given(p)
                else msgspec.Raw(_NO_PARAMETERS)
            )
        else:
            schema = msgspec.Raw(_encode(call_schema(tools)))
        fmt = {
            "type": "json_schema",
            "json_schema": {"name": "tool_call", "strict": True, "schema": schema},
        }
        self.body = engine_body(body, _tool_text(tools), {"response_format": fmt})
        self.ident = "chatcmpl-" + os.urandom(12).hex()
        self.call_id = "call_" + os.urandom(12).hex()
        self.created = int(time.time())

    def call(self, content: str) -> tuple[str, str]:
        """``(name, arguments)`` of the engine's constrained answer."""
        if self.single is not None:
            return self.single, content
        try:
            obj = msgspec.json.decode(content)
            return str(obj["name"]), _encode(obj["arguments"]).decode()
        except (msgspec.DecodeError, KeyError, TypeError):
            # Only a truncated answer (finish_reason "length") can fail the grammar.
            return self.tools[0].function.name, content

    async def respond(
        self, run: EngineCall, first: bytes, *, chat: bool, stream: bool
    ) -> Response | StreamResponse:
        model = run.model
        if not stream:
            answer = await collect(run, first)
            reason = answer.finish_reason or "stop"
            name, args = self.call(answer.text)
            usage = answer.usage.plain() if answer.usage is not None else s.Usage(0, 0, 0)
            msg = s.ToolMessage(
                "assistant",
                None,
                [
                    s.ToolCallOut(
                        self.call_id, "function", s.ToolCallFunction(name=name, arguments=args)
                    )
                ],
            )
            out = s.ToolCompletion(
                self.ident,
                "chat.completion",
                self.created,
                model,
                [s.ToolChoiceOut(0, msg, None, "tool_calls" if reason != "length" else "length")],
                usage,
            )
            return Response(200, [_encode(out)], content_type=JSON)
        return StreamResponse(
            GeneratedPieces(self._stream(run, first, model), run.close), framing="sse"
        )

    async def _stream(
        self, run: EngineCall, first: bytes, model: str
    ) -> AsyncGenerator[bytes, None]:
        usage_default: Any = None if self.include_usage else msgspec.UNSET
        head = s.ToolDelta(role="assistant", content=None)
        if self.single is not None:
            head.tool_calls = [
                s.ToolCallDelta(0, self.call_id, "function", {"name": self.single, "arguments": ""})
            ]
        yield self._chunk(model, head, None, usage_default)
        parts: list[str] = []
        reason = "stop"
        usage: s.EngineUsage | None = None
        chunk: bytes | None = first
        while chunk is not None:
            data = s.engine_chunk_decoder.decode(run.check(chunk))
            if data.usage is not None:
                usage = data.usage
            for c in data.choices:
                text = c.delta.content if c.delta is not None else None
                if text:
                    if self.single is not None:
                        delta = s.ToolDelta(
                            tool_calls=[s.ToolCallDelta(0, function={"arguments": text})]
                        )
                        yield self._chunk(model, delta, None, usage_default)
                    else:
                        parts.append(text)
                if c.finish_reason is not None:
                    reason = c.finish_reason
            chunk = await run.next_chunk()
        if self.single is None:
            name, args = self.call("".join(parts))
            call = s.ToolCallDelta(0, self.call_id, "function", {"name": name, "arguments": args})
            yield self._chunk(model, s.ToolDelta(tool_calls=[call]), None, usage_default)
        yield self._chunk(
            model, s.ToolDelta(), "tool_calls" if reason != "length" else "length", usage_default
        )
        if self.include_usage and usage is not None:
            yield self._usage_chunk(model, usage.plain())
        yield b"[DONE]"


# The text branch of the generic format: any answer that does not start with "{" (or
# with white space, so the first character decides text or call).
TEXT_ANSWER_PATTERN = r"/[^{\s][\s\S]*/"
_GENERIC_INSTRUCTIONS = (
    "To call functions, answer with only this JSON object and nothing else: "
    '{"tool_calls": [{"name": "<function name>", "arguments": {<its arguments>}}]}. '
    "Otherwise answer the user in plain text."
)


def generic_grammar(engine: ToolEngine, tools: list[s.Tool], max_calls: int | None = None) -> str:
    """The generic format's grammar: a plain text answer, or a call object whose
    ``tool_calls`` items match :func:`call_schema` (compiled by the engine's converter),
    at most ``max_calls`` of them."""
    calls: dict[str, Any] = {"type": "array", "minItems": 1, "items": call_schema(tools)}
    if max_calls is not None:
        calls["maxItems"] = max_calls
    schema = {
        "type": "object",
        "properties": {"tool_calls": calls},
        "required": ["tool_calls"],
    }
    try:
        grammar = engine.schema_grammar(_encode(schema))
    except (ValueError, RuntimeError) as exc:
        raise RequestError(f"the engine refused the tools' schemas: {exc}", param="tools") from None
    head, sep, rest = grammar.partition("\nstart:")
    if not head.startswith("%llguidance") or not sep:
        raise ZeroserveError("this engine build cannot express the generic tool-call grammar")
    return f"{head}\nstart: tool_call | text_answer\ntool_call:{rest}\ntext_answer: {TEXT_ANSWER_PATTERN}\n"


def _history_as_text(body: s.EngineChatRequest) -> s.EngineChatRequest:
    """Earlier assistant calls written as the generic format's call objects (a template
    without tools would drop them)."""
    messages = []
    for m in body.messages:
        if m.tool_calls:
            calls = [
                {"name": c.function.name, "arguments": _arguments(c.function.arguments)}
                for c in m.tool_calls
            ]
            m = msgspec.structs.replace(
                m, content=_encode({"tool_calls": calls}).decode(), tool_calls=None
            )
        messages.append(m)
    return msgspec.structs.replace(body, messages=messages)


def _arguments(text: str) -> Any:
    try:
        return msgspec.json.decode(text)
    except msgspec.DecodeError:
        return text


class AutoTool(_ToolAnswer):
    """``tool_choice: "auto"`` on a template without tools: the generic format."""

    def __init__(
        self,
        body: s.EngineChatRequest,
        tools: list[s.Tool],
        engine: ToolEngine,
        max_calls: int | None = None,
    ) -> None:
        self.tools = tools
        self.include_usage = bool(body.stream_options and body.stream_options.include_usage)
        system = _tool_text(tools, _GENERIC_INSTRUCTIONS, "You can call functions.")
        grammar = generic_grammar(engine, tools, max_calls)
        self.body = engine_body(_history_as_text(body), system, {"grammar": grammar})
        self.ident = "chatcmpl-" + os.urandom(12).hex()
        self.call_prefix = "call_" + os.urandom(8).hex()
        self.created = int(time.time())

    def calls(self, content: str) -> list[s.ToolCallOut] | None:
        """The answer's calls, or None when it is text (or a call cut short by
        ``max_tokens``, which is returned as the text it is)."""
        if not content.lstrip().startswith("{"):
            return None
        try:
            obj = msgspec.json.decode(content)
            return [
                s.ToolCallOut(
                    f"{self.call_prefix}_{i}",
                    "function",
                    s.ToolCallFunction(
                        name=str(c["name"]), arguments=_encode(c["arguments"]).decode()
                    ),
                )
                for i, c in enumerate(obj["tool_calls"])
            ]
        except (msgspec.DecodeError, KeyError, TypeError):
            return None

    async def respond(
        self, run: EngineCall, first: bytes, *, chat: bool, stream: bool
    ) -> Response | StreamResponse:
        model = run.model
        if not stream:
            answer = await collect(run, first)
            content = answer.text
            reason = answer.finish_reason or "stop"
            calls = self.calls(content)
            if calls is not None:
                msg = s.ToolMessage("assistant", None, calls)
                reason = "tool_calls"
            else:
                msg = s.ToolMessage("assistant", content, None)
            out = s.ToolCompletion(
                self.ident,
                "chat.completion",
                self.created,
                model,
                [s.ToolChoiceOut(0, msg, None, reason)],
                answer.usage.plain() if answer.usage is not None else s.Usage(0, 0, 0),
            )
            return Response(200, [_encode(out)], content_type=JSON)
        return StreamResponse(
            GeneratedPieces(self._stream(run, first, model), run.close), framing="sse"
        )

    async def _stream(
        self, run: EngineCall, first: bytes, model: str
    ) -> AsyncGenerator[bytes, None]:
        usage_default: Any = None if self.include_usage else msgspec.UNSET
        yield self._chunk(model, s.ToolDelta(role="assistant", content=None), None, usage_default)
        held: list[str] = []  # text before the first non-space character, or a call
        is_call: bool | None = None
        reason = "stop"
        usage: s.EngineUsage | None = None
        chunk: bytes | None = first
        while chunk is not None:
            data = s.engine_chunk_decoder.decode(run.check(chunk))
            if data.usage is not None:
                usage = data.usage
            for c in data.choices:
                text = c.delta.content if c.delta is not None else None
                if text and is_call is None:  # still deciding: hold the text
                    held.append(text)
                    lead = "".join(held).lstrip()
                    if lead:
                        is_call = lead.startswith("{")
                        if not is_call:
                            text, held = "".join(held), []
                            yield self._chunk(model, s.ToolDelta(content=text), None, usage_default)
                elif text and is_call:
                    held.append(text)
                elif text:
                    yield self._chunk(model, s.ToolDelta(content=text), None, usage_default)
                if c.finish_reason is not None:
                    reason = c.finish_reason
            chunk = await run.next_chunk()
        if held:
            content = "".join(held)
            calls = self.calls(content)
            if calls is not None:
                deltas = [
                    s.ToolCallDelta(
                        i,
                        c.id,
                        "function",
                        {"name": c.function.name, "arguments": c.function.arguments},
                    )
                    for i, c in enumerate(calls)
                ]
                yield self._chunk(model, s.ToolDelta(tool_calls=deltas), None, usage_default)
                reason = "tool_calls"
            else:
                yield self._chunk(model, s.ToolDelta(content=content), None, usage_default)
        yield self._chunk(model, s.ToolDelta(), reason, usage_default)
        if self.include_usage and usage is not None:
            yield self._usage_chunk(model, usage.plain())
        yield b"[DONE]"


class GeneratedPieces:
    """A ``PieceStream`` over an async generator of chunks, with what to release at its
    end (however it ends)."""

    __slots__ = ("_gen", "_on_close")

    def __init__(self, gen: AsyncGenerator[bytes, None], on_close: Callable[[], None]) -> None:
        self._gen = gen
        self._on_close = on_close

    def __anext__(self) -> Awaitable[bytes]:
        return self._gen.__anext__()

    def receive_batch_nowait(self, max_items: int) -> list[Any]:
        return []  # every chunk is made by the generator, one at a time

    async def aclose(self) -> None:
        try:
            await self._gen.aclose()
        finally:
            self._on_close()

    @property
    def finish_reason(self) -> str | None:
        return None


def release_ticket(ticket: Any) -> None:
    """Release an admission ticket unless it is gone already: a request's ticket is
    released by whichever of its ends comes first (answer sent, error, disconnect)."""
    if ticket is not None and not ticket.released:
        ticket.release()
