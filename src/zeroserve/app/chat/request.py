"""The one chat request (docs/architecture.md, "One chat path").

Every chat-like API (chat completions, completions, the Responses API, Anthropic's
Messages) decodes its own
shape at the boundary and translates it into a :class:`ChatRequest`; every backend
serves that. So a backend never sees an API's wire shape, and a front end never knows
which backend answers. The request is already checked: its ranges by the front end's
schema, its counts by ``app/limits.py``. What a backend cannot honour it refuses with
:meth:`ChatRequest.refuse`, a 400 that names the parameter as the client's API spells
it (``names``: ``max_tokens`` is ``max_output_tokens`` on the Responses API).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

import msgspec

from ...errors import RequestError
from .images import ImagePart

# "function": the deprecated role of a function call's result, passed on as sent.
# The optional parameters of a chat request, in the order a refusal names the first one a
# backend does not honour (docs/architecture.md, "One chat path"). Every backend honours
# the rest (the prompt or conversation, max_tokens, temperature, top_p, seed, stop, n,
# stream and usage); a backend declares which of these it honours
# (``Capabilities.honours``), and one given at a value that would change the answer is
# refused by the others.
OPTIONAL_PARAMETERS: tuple[str, ...] = (
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
)

# A front end that spells every parameter as the chat request does.
_SPELLED_AS_HERE: Mapping[str, str] = {}

Role = Literal["system", "user", "assistant", "tool", "function"]


class ToolCall(msgspec.Struct, frozen=True):
    """A call an earlier assistant turn made (sent back in the conversation)."""

    id: str
    name: str
    arguments: str  # JSON text, as the model wrote it


class Turn(msgspec.Struct):
    """One turn of the conversation. ``content`` is text (an API's text parts joined
    with newlines); ``tool_calls`` are an assistant turn's calls; ``tool_call_id`` names
    the call a ``tool`` turn answers; ``parts``: a turn with images, its text parts and
    images in the order sent (``content`` then holds its text alone)."""

    role: Role
    content: str | None = None
    name: str | None = None
    tool_calls: list[ToolCall] | None = None
    tool_call_id: str | None = None
    parts: list[str | ImagePart] | None = None

    def images(self) -> list[ImagePart]:
        return [p for p in self.parts or () if isinstance(p, ImagePart)]


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


class ChatRequest:
    """A chat (``messages``) or a completion (``prompts``, each its own generations).

    ``n`` choices of each prompt (or of the conversation). ``logprobs``: per-token log
    probabilities, with ``top_logprobs`` alternatives each. ``timeout``: the client's own,
    in seconds (its SDK's timeout headers). ``top_k``: sample among the k likeliest
    tokens (an optional parameter); ``min_p``: drop tokens less likely than this
    fraction of the likeliest; ``repetition_penalty``: divide the logits of tokens
    already in the prompt or answer by it (vLLM's and llama.cpp's, 1 neutral);
    ``ignore_eos``: generate on past the end-of-sequence token, to ``max_tokens``
    (benchmark clients' fixed output lengths); ``min_tokens``: no end-of-sequence
    token before this many tokens (vLLM's extensions). ``continuous_usage``: a stream
    carries the usage so far on every chunk (vLLM's
    ``stream_options.continuous_usage_stats``). ``report_stop``: the answer says which stop string
    ended it (``Finish.stop_sequence``, Anthropic's ``stop_sequence``), so a backend whose
    model would match stop strings out of sight matches them where it can see them.
    ``continues``: the answer continues the conversation's last turn, an assistant's
    (Anthropic's prefill), rather than starting a new one; a backend that cannot refuses
    it.
    ``images``: the conversation's images, in order (each turn's ``parts``).
    ``names``: how the client's API spells a
    parameter, for the errors that name it (a name absent is spelled as here).
    ``origin``: what the front end keeps of its own request for its answer (opaque to
    backends).

    A plain class, not a dataclass: compiled, its fields are read and set natively, and it
    is built once per request (docs/decisions/0008-types-decide-the-calls.md)."""

    def __init__(
        self,
        *,
        model: str,
        messages: list[Turn] | None = None,
        prompts: list[str] | None = None,
        n: int = 1,
        max_tokens: int | None = None,
        temperature: float | None = None,
        top_p: float | None = None,
        top_k: int | None = None,
        min_p: float | None = None,
        repetition_penalty: float | None = None,
        ignore_eos: bool = False,
        min_tokens: int | None = None,
        seed: int | None = None,
        priority: int | None = None,
        keep_alive: float | None = None,
        stop: list[str] | None = None,
        presence_penalty: float | None = None,
        frequency_penalty: float | None = None,
        logit_bias: dict[str, float] | None = None,
        logprobs: bool = False,
        top_logprobs: int | None = None,
        response_format: OutputFormat | None = None,
        tools: list[FunctionTool] | None = None,
        tool_choice: ToolChoice | None = None,
        parallel_tool_calls: bool | None = None,
        max_tool_calls: int | None = None,
        stream: bool = False,
        include_usage: bool = False,
        continuous_usage: bool = False,
        timeout: float | None = None,
        report_stop: bool = False,
        continues: bool = False,
        names: Mapping[str, str] | None = None,
        origin: Any = None,
    ) -> None:
        self.model = model
        self.messages = messages
        self.prompts = prompts
        self.n = n
        self.max_tokens = max_tokens
        self.temperature = temperature
        self.top_p = top_p
        self.top_k = top_k
        self.min_p = min_p
        self.repetition_penalty = repetition_penalty
        self.ignore_eos = ignore_eos
        self.min_tokens = min_tokens
        self.seed = seed
        self.priority = priority  # the class it asks for (app/priorities.py); None: none
        self.keep_alive = keep_alive  # seconds the model stays loaded once idle (app/keep_alive.py)
        self.stop: list[str] = stop if stop is not None else []
        self.presence_penalty = presence_penalty
        self.frequency_penalty = frequency_penalty
        self.logit_bias = logit_bias
        self.logprobs = logprobs
        self.top_logprobs = top_logprobs
        self.response_format = response_format
        self.tools = tools
        self.tool_choice = tool_choice
        self.parallel_tool_calls = parallel_tool_calls
        self.max_tool_calls = max_tool_calls
        self.stream = stream
        self.include_usage = include_usage
        self.continuous_usage = continuous_usage
        self.timeout = timeout
        self.report_stop = report_stop
        self.continues = continues
        self.names: Mapping[str, str] = names if names is not None else _SPELLED_AS_HERE
        self.origin = origin
        self.images: list[ImagePart] = [p for m in messages or () for p in m.images()]

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

    def given(self) -> list[str]:
        """The optional parameters given at a value that changes the answer (a neutral
        value, such as a 0 penalty or a ``text`` format, changes nothing)."""
        fmt = self.response_format
        choice = self.tool_choice
        out: list[str] = []
        if self.logprobs:
            out.append("logprobs")
        if self.top_logprobs:
            out.append("top_logprobs")
        if self.presence_penalty:
            out.append("presence_penalty")
        if self.frequency_penalty:
            out.append("frequency_penalty")
        if self.logit_bias:
            out.append("logit_bias")
        if fmt is not None and fmt.type != "text":
            out.append("response_format")
        if self.tools:
            out.append("tools")
        if choice is not None and choice.mode == "required":
            out.append("tool_choice")
        if self.max_tool_calls is not None:
            out.append("max_tool_calls")
        if self.top_k is not None:
            out.append("top_k")
        if self.min_p:
            out.append("min_p")
        if self.repetition_penalty is not None and self.repetition_penalty != 1.0:
            out.append("repetition_penalty")
        if self.ignore_eos:
            out.append("ignore_eos")
        if self.min_tokens:
            out.append("min_tokens")
        return out

    def refuse_unhonoured(self, honours: frozenset[str]) -> None:
        """A 400 naming the first optional parameter given that ``honours`` lacks."""
        for name in self.given():
            if name not in honours:
                raise self.refuse(name)

    def refuse_images(self) -> None:
        """A 400 naming the first image, for a model that reads no images."""
        if self.images:
            raise RequestError(
                "this model takes text only; it reads no images "
                "(GET /v1/models: capabilities.input_modalities)",
                param=self.images[0].param,
                code="image_input_not_supported",
            )

    def refuse(self, name: str, why: str = "is not supported by this model") -> RequestError:
        """The 400 for a parameter the serving backend cannot honour, naming it."""
        spelled = self.param(name)
        return RequestError(f"'{spelled}' {why}", param=spelled)
