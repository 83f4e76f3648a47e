"""The one chat request (docs/architecture.md, "One chat path").

Every chat-like API (chat completions, completions, the Responses API) decodes its own
shape at the boundary and translates it into a :class:`ChatRequest`; every backend
serves that. So a backend never sees an API's wire shape, and a front end never knows
which backend answers. The request is already checked: its ranges by the front end's
schema, its counts by ``app/limits.py``. What a backend cannot honour it refuses with
:meth:`ChatRequest.refuse`, a 400 that names the parameter as the client's API spells
it (``names``: ``max_tokens`` is ``max_output_tokens`` on the Responses API).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

import msgspec

from ...errors import RequestError

# "function": the deprecated role of a function call's result, passed on as sent.
Role = Literal["system", "user", "assistant", "tool", "function"]


class ToolCall(msgspec.Struct, frozen=True):
    """A call an earlier assistant turn made (sent back in the conversation)."""

    id: str
    name: str
    arguments: str  # JSON text, as the model wrote it


class Turn(msgspec.Struct):
    """One turn of the conversation. ``content`` is text (an API's text parts joined
    with newlines); ``tool_calls`` are an assistant turn's calls; ``tool_call_id`` names
    the call a ``tool`` turn answers."""

    role: Role
    content: str | None = None
    name: str | None = None
    tool_calls: list[ToolCall] | None = None
    tool_call_id: str | None = None


class FunctionTool(msgspec.Struct, frozen=True):
    """A function the model may call. ``parameters``: its JSON Schema, as sent."""

    name: str
    description: str | None = None
    parameters: msgspec.Raw | None = None
    strict: bool | None = None


class ToolChoice(msgspec.Struct, frozen=True):
    """Whether the model must call a tool (``required``), may (``auto``) or must not
    (``none``); ``allowed``: the names of the tools it may call, when not every one (a
    named function is ``required`` with that one name allowed)."""

    mode: Literal["none", "auto", "required"] = "auto"
    allowed: tuple[str, ...] | None = None


class OutputFormat(msgspec.Struct, frozen=True):
    """The answer's format: free text, any JSON object, or JSON matching ``schema``."""

    type: Literal["text", "json_object", "json_schema"]
    schema: msgspec.Raw | None = None
    name: str | None = None
    description: str | None = None
    strict: bool | None = None


@dataclass(slots=True)
class ChatRequest:
    """A chat (``messages``) or a completion (``prompts``, each its own generations).

    ``n`` choices of each prompt (or of the conversation). ``logprobs``: per-token log
    probabilities, with ``top_logprobs`` alternatives each. ``names``: how the client's
    API spells a parameter, for the errors that name it (a name absent is spelled as
    here)."""

    model: str
    messages: list[Turn] | None = None
    prompts: list[str] | None = None
    n: int = 1
    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    seed: int | None = None
    stop: list[str] = field(default_factory=list)
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    logit_bias: dict[str, float] | None = None
    logprobs: bool = False
    top_logprobs: int | None = None
    response_format: OutputFormat | None = None
    tools: list[FunctionTool] | None = None
    tool_choice: ToolChoice | None = None
    parallel_tool_calls: bool | None = None
    max_tool_calls: int | None = None
    stream: bool = False
    include_usage: bool = False
    timeout: float | None = None  # the client's own (its SDK's timeout headers), seconds
    names: Mapping[str, str] = field(default_factory=dict)
    # What the front end keeps of its own request for its answer (opaque to backends).
    origin: Any = None

    @property
    def chat(self) -> bool:
        """A conversation (templated by the model), not raw prompts."""
        return self.messages is not None

    @property
    def generations(self) -> int:
        """How many generations the request starts (prompts x ``n``)."""
        return (len(self.prompts) if self.prompts is not None else 1) * self.n

    def param(self, name: str) -> str:
        """``name`` as the client's API spells it."""
        return self.names.get(name, name)

    def refuse(self, name: str, why: str = "is not supported by this model") -> RequestError:
        """The 400 for a parameter the serving backend cannot honour, naming it."""
        spelled = self.param(name)
        return RequestError(f"'{spelled}' {why}", param=spelled)
