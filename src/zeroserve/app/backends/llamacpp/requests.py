"""What goes to the llama.cpp engine for one chat request: an engine request per choice
(prompt-major), each encoded once from the one chat request (:mod:`.wire`), and what the
checks before a slot need (docs/architecture.md, "The llama.cpp backend").

A chat without a system message gets the model's default system prompt (its
``system_prompt`` option), unless a tool plan writes its own. The prompt's UTF-8 bytes,
plus the template's overhead, bound its tokens (byte-level BPE vocabularies): a request
whose bound fits a slot's context needs no tokenizer.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

from ...chat import ChatRequest
from . import wire
from .tools import AutoTool, ForcedTool, NativeTools, ToolEngine, plan

# Tokens a chat template adds around each message (role markers, separators) and once
# per conversation (the assistant header, a default system prompt: SmolLM2's is 20
# tokens). Generous bounds: they only decide when the exact count is needed.
TEMPLATE_TOKENS_PER_MESSAGE = 8
TEMPLATE_TOKENS_FIXED = 64


class PromptEngine(ToolEngine, Protocol):
    """What building the requests needs of the serving model."""

    alias: str
    system_prompt: str | None


@dataclass(frozen=True, slots=True)
class Requests:
    """The engine requests of one chat request.

    ``bound``: an upper bound of the longest prompt's tokens; ``chat`` (a chat: its
    engine request, tools, tool choice and format included, which the engine's template
    renders exactly as it renders the request it runs) or ``prompts`` (completions): what
    an exact count templates and tokenizes; ``plan``: the tool plan whose output the
    answer goes through; ``error_param``: what an engine's refusal of the request names."""

    bodies: list[bytes]
    bound: int
    chat: bytes | None
    prompts: list[str] | None
    plan: ForcedTool | AutoTool | None
    error_param: str | None


def requests(chat: ChatRequest, engine: PromptEngine) -> Requests:
    """The engine requests of ``chat`` (a 400 naming what the engine cannot honour)."""
    alias = engine.alias
    seeds = [None if chat.seed is None else chat.seed + j for j in range(chat.n)]
    if chat.messages is None:
        assert chat.prompts is not None
        bodies = [
            wire.completion_body(chat, alias, p, seed) for p in chat.prompts for seed in seeds
        ]
        bound = max(len(p.encode()) for p in chat.prompts) + TEMPLATE_TOKENS_FIXED
        return Requests(bodies, bound, None, chat.prompts, None, None)
    planned = plan(chat, engine)
    tool_plan = planned if isinstance(planned, ForcedTool | AutoTool) else None
    if tool_plan is not None:
        messages = tool_plan.messages(chat)
        extra = tool_plan.extra()
    else:
        messages = [wire.message(m) for m in chat.messages]
        system = engine.system_prompt
        if system is not None and not any(m.role == "system" for m in chat.messages):
            messages.insert(0, {"role": "system", "content": system})
        extra = _tool_fields(chat, planned if isinstance(planned, NativeTools) else None)
    bound = TEMPLATE_TOKENS_FIXED + TEMPLATE_TOKENS_PER_MESSAGE * len(messages)
    for m in messages:
        content = m.get("content") or ""
        if isinstance(content, list):  # parts: the text ones (images: see backend.py)
            bound += sum(len(p.get("text", "").encode()) for p in content)
        else:
            bound += len(str(content).encode())
        for c in m.get("tool_calls") or ():
            f = c["function"]
            bound += len(f["name"].encode()) + len(f["arguments"].encode())
    for t in chat.tools or ():
        bound += len(t.name) + (len(t.parameters) if t.parameters is not None else 0)
    bodies = [wire.chat_body(chat, alias, messages, seed, extra) for seed in seeds]
    fmt = chat.response_format
    error_param = (
        "tools"
        if tool_plan is not None
        else chat.param("response_format")
        if fmt is not None and fmt.type != "text"
        else chat.param("messages")  # what is left: the conversation's shape
    )
    return Requests(bodies, bound, bodies[0], None, tool_plan, error_param)


def _tool_fields(chat: ChatRequest, native: NativeTools | None) -> dict[str, Any]:
    """The tools and the format, as the engine takes them (its template renders the
    tools; ``native``: only the allowed ones, the template choosing)."""
    out: dict[str, Any] = {}
    fmt = chat.response_format
    if fmt is not None and fmt.type != "text":
        out["response_format"] = wire.response_format(fmt)
    if native is not None:
        out["tools"] = [wire.tool(t) for t in native.tools]
        out["tool_choice"] = "auto"
    elif chat.tools:
        out["tools"] = [wire.tool(t) for t in chat.tools]
        choice = chat.tool_choice
        out["tool_choice"] = choice.mode if choice is not None else "auto"
        if chat.parallel_tool_calls is not None:
            out["parallel_tool_calls"] = chat.parallel_tool_calls
    return out
