"""Tool calls on a llama.cpp model, for every API that has tools (docs/architecture.md,
"The llama.cpp backend").

A call the client requires (``tool_choice`` ``required``, or a named function) must
always be a valid call, whatever the model's chat template knows of tools (SmolLM2's
knows nothing). So the request is rewritten for the engine (:class:`ForcedTool`): the
tools leave it, a system message describes them, and a ``json_schema`` response format
constrains the answer by grammar: the function's ``parameters`` (one tool) or
``{"name", "arguments"}`` with one branch per tool (several). Its text then becomes the
call: argument fragments as the engine makes them (one tool: the call's id and name
come first), or the whole call once its object is complete (several).

``auto`` (or tools without a choice) goes to the engine unchanged when its template has
native tool calls (``native_tools``): the engine renders the tools and parses the calls,
among the allowed ones only when ``tool_choice`` allows some (:class:`NativeTools`).
Other templates get the generic format (:class:`AutoTool`): a system message and a
grammar that allows either plain text or one ``{"tool_calls": [...]}`` object (the same
per-tool call schema, compiled by the engine's own converter), ``maxItems`` bounding the
calls (``parallel_tool_calls: false``, ``max_tool_calls``). An answer that starts with
``{`` is calls (sent whole once the object is complete); any other answer is text,
streamed as it comes. ``none`` goes to the engine unchanged.

The plans work on the one chat request and its pieces, so chat completions and the
Responses API share them; each API writes the calls in its own shape.
"""

from __future__ import annotations

import os
from collections import deque
from typing import Any, Protocol

import msgspec

from ....errors import RequestError, ZeroserveError
from ...chat import CallDelta, ChatRequest, DeltaPiece, Finish, FunctionTool, Piece, ToolCall, Turn
from .output import EngineOutput
from .wire import message

_encode = msgspec.json.encode
_NO_PARAMETERS = b'{"type":"object"}'
# The text branch of the generic format: any answer that does not start with "{" (or
# with white space, so the first character decides text or call).
TEXT_ANSWER_PATTERN = r"/[^{\s][\s\S]*/"
_GENERIC_INSTRUCTIONS = (
    "To call functions, answer with only this JSON object and nothing else: "
    '{"tool_calls": [{"name": "<function name>", "arguments": {<its arguments>}}]}. '
    "Otherwise answer the user in plain text."
)


class ToolEngine(Protocol):
    """What the plans need of the serving model."""

    @property
    def native_tools(self) -> bool: ...

    def schema_grammar(self, schema: bytes) -> str: ...


class NativeTools:
    """``auto`` among allowed tools on a template with native tool calls: the engine
    gets only those tools and ``"auto"`` (llama.cpp knows no ``allowed_tools``)."""

    __slots__ = ("tools",)

    def __init__(self, tools: list[FunctionTool]) -> None:
        self.tools = tools


def plan(chat: ChatRequest, engine: ToolEngine) -> ForcedTool | AutoTool | NativeTools | None:
    """How the engine serves ``chat``'s tools: a rewritten request (a forced call, the
    generic format), only some tools (native), or as the request came (None)."""
    tools = chat.tools
    if not tools:
        return None
    choice = chat.tool_choice
    mode = choice.mode if choice is not None else "auto"
    allowed = choice.allowed if choice is not None else None
    offered = tools if allowed is None else [t for t in tools if t.name in set(allowed)]
    if mode == "none":
        return None
    if mode == "auto" and engine.native_tools:
        if chat.max_tool_calls is not None:
            raise chat.refuse(
                "max_tool_calls", "is not supported with this model's native tool calls"
            )
        return NativeTools(offered) if allowed is not None else None
    fmt = chat.response_format
    if fmt is not None and fmt.type != "text":
        raise chat.refuse(
            "response_format",
            "cannot be combined with a forced tool_choice"
            if mode == "required"
            else "cannot be combined with tools on this model",
        )
    if chat.n > 1:
        raise chat.refuse(
            "n",
            "> 1 is not supported with a forced tool_choice"
            if mode == "required"
            else "> 1 is not supported with tools on this model",
        )
    if mode == "required":
        return ForcedTool(offered)
    max_calls = chat.max_tool_calls
    if chat.parallel_tool_calls is False:
        max_calls = 1
    return AutoTool(offered, engine, max_calls)


def _tool_text(
    tools: list[FunctionTool],
    instructions: str = "Answer with the function's arguments as JSON.",
    intro: str = "You call a function to answer.",
) -> str:
    lines = [intro + " The functions:"]
    for t in tools:
        params = bytes(t.parameters).decode() if t.parameters is not None else "{}"
        lines.append(f"- {t.name}: {t.description or ''} Parameters (JSON Schema): {params}")
    lines.append(instructions)
    return "\n".join(lines)


def _parameters(tool: FunctionTool) -> Any:
    p = tool.parameters
    return msgspec.json.decode(bytes(p)) if p is not None else {"type": "object"}


def call_schema(tools: list[FunctionTool]) -> Any:
    """The JSON Schema of one call ``{"name", "arguments"}`` of any of ``tools``: one
    branch per tool, its name a constant and its arguments the function's parameters."""
    return {
        "anyOf": [
            {
                "type": "object",
                "properties": {"name": {"const": t.name}, "arguments": _parameters(t)},
                "required": ["name", "arguments"],
            }
            for t in tools
        ]
    }


def generic_grammar(
    engine: ToolEngine, tools: list[FunctionTool], max_calls: int | None = None
) -> str:
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


def _text(piece: Piece) -> str:
    if type(piece) is str:
        return piece
    assert isinstance(piece, DeltaPiece)
    return piece.text or ""


def _arguments(text: str) -> Any:
    try:
        return msgspec.json.decode(text)
    except msgspec.DecodeError:
        return text


class ForcedTool:
    """An answer that must be a call of one of ``tools`` (grammar-constrained)."""

    def __init__(self, tools: list[FunctionTool]) -> None:
        self.tools = tools
        self.single = tools[0].name if len(tools) == 1 else None
        self.call_id = "call_" + os.urandom(12).hex()

    def messages(self, chat: ChatRequest) -> list[dict[str, Any]]:
        assert chat.messages is not None
        head = {"role": "system", "content": _tool_text(self.tools)}
        return [head, *(message(m) for m in chat.messages)]

    def extra(self) -> dict[str, Any]:
        if self.single is not None:
            p = self.tools[0].parameters
            schema = p if p is not None else msgspec.Raw(_NO_PARAMETERS)
        else:
            schema = msgspec.Raw(_encode(call_schema(self.tools)))
        fmt = {
            "type": "json_schema",
            "json_schema": {"name": "tool_call", "strict": True, "schema": schema},
        }
        return {"response_format": fmt}

    def call(self, content: str) -> tuple[str, str]:
        """``(name, arguments)`` of the engine's constrained answer."""
        if self.single is not None:
            return self.single, content
        try:
            obj = msgspec.json.decode(content)
            return str(obj["name"]), _encode(obj["arguments"]).decode()
        except (msgspec.DecodeError, KeyError, TypeError):
            # Only a truncated answer (finish_reason "length") can fail the grammar.
            return self.tools[0].name, content

    def output(self, inner: EngineOutput) -> PlannedOutput:
        return PlannedOutput(inner, _ForcedState(self))


class _ForcedState:
    __slots__ = ("held", "plan")

    def __init__(self, plan: ForcedTool) -> None:
        self.plan = plan
        self.held: list[str] = []

    def start(self) -> list[Piece]:
        plan = self.plan
        if plan.single is None:
            return []
        return [DeltaPiece(call=CallDelta(0, "", id=plan.call_id, name=plan.single))]

    def feed(self, piece: Piece) -> list[Piece]:
        text = _text(piece)
        if not text:
            return []
        if self.plan.single is not None:
            return [DeltaPiece(call=CallDelta(0, text))]
        self.held.append(text)
        return []

    def end(self) -> list[Piece]:
        plan = self.plan
        if plan.single is not None:
            return []
        name, args = plan.call("".join(self.held))
        return [DeltaPiece(call=CallDelta(0, args, id=plan.call_id, name=name))]

    def reason(self, reason: str) -> str:
        return "length" if reason == "length" else "tool_calls"


class AutoTool:
    """``auto`` on a template without tools: the generic format."""

    def __init__(
        self, tools: list[FunctionTool], engine: ToolEngine, max_calls: int | None = None
    ) -> None:
        self.tools = tools
        self.grammar = generic_grammar(engine, tools, max_calls)
        self.call_prefix = "call_" + os.urandom(8).hex()

    def messages(self, chat: ChatRequest) -> list[dict[str, Any]]:
        """The generic system message, then the conversation, earlier calls written as
        the format's call objects (a template without tools would drop them)."""
        assert chat.messages is not None
        system = _tool_text(self.tools, _GENERIC_INSTRUCTIONS, "You can call functions.")
        out = [{"role": "system", "content": system}]
        for m in chat.messages:
            if m.tool_calls:
                calls = [
                    {"name": c.name, "arguments": _arguments(c.arguments)} for c in m.tool_calls
                ]
                m = Turn(
                    role=m.role,
                    content=_encode({"tool_calls": calls}).decode(),
                    name=m.name,
                    tool_call_id=m.tool_call_id,
                )
            out.append(message(m))
        return out

    def extra(self) -> dict[str, Any]:
        return {"grammar": self.grammar}

    def calls(self, content: str) -> list[ToolCall] | None:
        """The answer's calls, or None when it is text (or a call cut short by
        ``max_tokens``, which is returned as the text it is)."""
        if not content.lstrip().startswith("{"):
            return None
        try:
            obj = msgspec.json.decode(content)
            return [
                ToolCall(
                    id=f"{self.call_prefix}_{i}",
                    name=str(c["name"]),
                    arguments=_encode(c["arguments"]).decode(),
                )
                for i, c in enumerate(obj["tool_calls"])
            ]
        except (msgspec.DecodeError, KeyError, TypeError):
            return None

    def output(self, inner: EngineOutput) -> PlannedOutput:
        return PlannedOutput(inner, _AutoState(self))


class _AutoState:
    __slots__ = ("called", "held", "is_call", "plan")

    def __init__(self, plan: AutoTool) -> None:
        self.plan = plan
        self.held: list[str] = []  # text before the first non-space character, or a call
        self.is_call: bool | None = None
        self.called = False

    def start(self) -> list[Piece]:
        return []

    def feed(self, piece: Piece) -> list[Piece]:
        text = _text(piece)
        if not text:
            return []
        if self.is_call is None:  # still deciding: hold the text
            self.held.append(text)
            lead = "".join(self.held).lstrip()
            if lead:
                self.is_call = lead.startswith("{")
                if not self.is_call:
                    out, self.held = "".join(self.held), []
                    return [out]
            return []
        if self.is_call:
            self.held.append(text)
            return []
        return [text]

    def end(self) -> list[Piece]:
        if not self.held:
            return []
        content = "".join(self.held)
        calls = self.plan.calls(content)
        if calls is None:
            return [content]
        self.called = True
        return [
            DeltaPiece(call=CallDelta(i, c.arguments, id=c.id, name=c.name))
            for i, c in enumerate(calls)
        ]

    def reason(self, reason: str) -> str:
        return "tool_calls" if self.called else reason


class _State(Protocol):
    def start(self) -> list[Piece]: ...

    def feed(self, piece: Piece) -> list[Piece]: ...

    def end(self) -> list[Piece]: ...

    def reason(self, reason: str) -> str: ...


class PlannedOutput:
    """An engine output whose text a plan turns into tool calls (an ``Output``)."""

    __slots__ = ("_begun", "_ended", "_inner", "_out", "_state")

    def __init__(self, inner: EngineOutput, state: _State) -> None:
        self._inner = inner
        self._state = state
        self._out: deque[Piece] = deque()
        self._begun = False
        self._ended = False

    @property
    def index(self) -> int:
        return self._inner.index

    def __aiter__(self) -> PlannedOutput:
        return self

    async def __anext__(self) -> Piece:
        out = self._out
        while not out:
            if self._ended:
                raise StopAsyncIteration
            try:
                piece = await self._inner.__anext__()
            except StopAsyncIteration:
                self._ended = True
                self._begin()
                out.extend(self._state.end())
                continue
            self._take(piece)
        return out.popleft()

    def take_ready(self, max_items: int) -> list[Piece]:
        for piece in self._inner.take_ready(max_items):
            self._take(piece)
        out: list[Piece] = []
        while self._out and len(out) < max_items:
            out.append(self._out.popleft())
        return out

    def _begin(self) -> None:
        if not self._begun:
            self._begun = True
            self._out.extend(self._state.start())

    def _take(self, piece: Piece) -> None:
        self._begin()
        self._out.extend(self._state.feed(piece))

    async def aclose(self) -> None:
        await self._inner.aclose()

    def tokens_so_far(self) -> tuple[int, int]:
        return self._inner.tokens_so_far()

    def finish(self) -> Finish:
        f = self._inner.finish()
        return Finish(
            self._state.reason(f.reason),
            f.completion_tokens,
            f.prompt_tokens,
            f.cached_tokens,
            f.stop_sequence,
        )
