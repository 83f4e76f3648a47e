"""Whole answers of engine-backed models, assembled from the engine's chunks.

Strategy (docs/architecture.md, "The in-process engine")
--------------------------------------------------------
The engine calls its callback once per chunk only when it streams; a whole answer comes
in one call at its end, so nothing could stop its slot early. Every engine request is
therefore streamed from the engine (``streamed``: ``stream`` and
``stream_options.include_usage`` set in the body's bytes), and a whole answer is put
together here: :func:`collect` reads the chunks (each decoded once, with msgspec) until
the last and closes the call however that ends, so a deadline, an engine error or a
client that leaves stops the slot at the next token. :func:`whole_answer` then writes
OpenAI's ``chat.completion`` or ``text_completion`` object (the same content, finish
reason, logprobs and usage as the engine's own whole answer, the served model's name,
never the GGUF's path). The Responses API and the tool plans read the same
:class:`Collected` (``engine_responses``, ``engine_tools``).
"""

from __future__ import annotations

from typing import Protocol

import msgspec
from msgspec import UNSET, Struct, UnsetType

from .openai import schemas as s
from .relay._rewrite import value_spans

_encode = msgspec.json.encode
_STREAMED = (
    (b"stream", b"true"),
    (b"stream_options", b'{"include_usage":true}'),
)


class EngineCall(Protocol):
    """What assembling an answer needs of one engine call (``engine_relay._Run``)."""

    def check(self, chunk: bytes) -> bytes: ...

    async def next_chunk(self) -> bytes | None: ...

    def close(self) -> None: ...


def streamed(payload: bytes) -> bytes:
    """``payload`` (an engine request body) asking for a stream with its usage: each
    field's value replaced where the body has it, added after the ``{`` where not (the
    rest of the body is not re-encoded)."""
    edits: list[tuple[int, int, bytes]] = []
    head = payload.index(b"{") + 1
    for key, value in _STREAMED:
        spans = value_spans(payload, key.decode())
        if spans:
            edits += [(a, b, value) for a, b in spans]
        else:
            edits.append((head, head, b'"%s":%s,' % (key, value)))
    out: list[bytes] = []
    pos = 0
    for start, end, new in sorted(edits, key=lambda e: (e[0], e[1])):
        out += (payload[pos:start], new)
        pos = end
    out.append(payload[pos:])
    return b"".join(out)


class _Call:
    """One native tool call, as its deltas build it."""

    __slots__ = ("arguments", "id", "name", "type")

    def __init__(self) -> None:
        self.id = ""
        self.type = "function"
        self.name = ""
        self.arguments: list[str] = []


class Collected:
    """One choice's answer, put together from its chunks."""

    def __init__(self) -> None:
        self.id = ""
        self.created = 0
        self.system_fingerprint: str | None = None
        self.parts: list[str] = []  # chat content, or completion text
        self.reasoning: list[str] = []
        self.calls: dict[int, _Call] = {}
        self.logprobs: list[msgspec.Raw] | None = None
        self.finish_reason: str | None = None
        self.usage: s.EngineUsage | None = None

    @property
    def text(self) -> str:
        return "".join(self.parts)

    def add(self, chunk: s.EngineChunk) -> None:
        self.id = self.id or chunk.id
        self.created = self.created or chunk.created
        self.system_fingerprint = self.system_fingerprint or chunk.system_fingerprint
        if chunk.usage is not None:
            self.usage = chunk.usage
        for c in chunk.choices:
            if c.text:
                self.parts.append(c.text)
            d = c.delta
            if d is not None:
                if d.content:
                    self.parts.append(d.content)
                if d.reasoning_content:
                    self.reasoning.append(d.reasoning_content)
                for t in d.tool_calls or ():
                    call = self.calls.setdefault(t.index, _Call())
                    call.id = t.id or call.id
                    call.type = t.type or call.type
                    if t.function is not None:
                        call.name = t.function.name or call.name
                        if t.function.arguments:
                            call.arguments.append(t.function.arguments)
            if c.logprobs is not None and c.logprobs.content is not None:
                if self.logprobs is None:
                    self.logprobs = []
                self.logprobs += c.logprobs.content
            if c.finish_reason is not None:
                self.finish_reason = c.finish_reason

    def tool_calls(self) -> list[s.ToolCallOut]:
        return [
            s.ToolCallOut(
                c.id, c.type, s.ToolCallFunction(name=c.name, arguments="".join(c.arguments))
            )
            for _, c in sorted(self.calls.items())
        ]

    def logprobs_raw(self) -> msgspec.Raw | None:
        if self.logprobs is None:
            return None
        return msgspec.Raw(b'{"content":[' + b",".join(bytes(r) for r in self.logprobs) + b"]}")


async def collect(call: EngineCall, first: bytes) -> Collected:
    """Every chunk of ``call`` (from ``first``), read into one answer; the call is closed
    however this ends, which stops the engine's slot if it still runs."""
    out = Collected()
    chunk: bytes | None = first
    try:
        while chunk is not None:
            out.add(s.engine_chunk_decoder.decode(call.check(chunk)))
            chunk = await call.next_chunk()
    finally:
        call.close()
    return out


# -- OpenAI's whole objects ------------------------------------------------------------------
class WholeUsage(Struct, omit_defaults=True):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    prompt_tokens_details: s.PromptTokensDetails | UnsetType = UNSET


class WholeMessage(Struct, omit_defaults=True):
    role: str
    content: str | None
    reasoning_content: str | UnsetType = UNSET
    tool_calls: list[s.ToolCallOut] | UnsetType = UNSET


class ChatChoice(Struct):
    index: int
    message: WholeMessage
    logprobs: msgspec.Raw | None
    finish_reason: str | None


class TextChoice(Struct):
    text: str
    index: int
    logprobs: msgspec.Raw | None
    finish_reason: str | None


class WholeAnswer(Struct, omit_defaults=True):
    id: str
    object: str
    created: int
    model: str
    choices: list[ChatChoice] | list[TextChoice]
    usage: WholeUsage
    system_fingerprint: str | UnsetType = UNSET


def _message(a: Collected) -> WholeMessage:
    calls = a.tool_calls()
    return WholeMessage(
        "assistant",
        a.text if a.parts or not calls else None,
        "".join(a.reasoning) if a.reasoning else UNSET,
        calls if calls else UNSET,
    )


def whole_answer(answers: list[Collected], model: str, *, chat: bool) -> bytes:
    """OpenAI's whole ``chat.completion`` (``chat``) or ``text_completion`` object for
    ``answers``, one choice each (numbered in order), named ``model``. Usage: the prompt
    once (every choice has the same), the completions summed."""
    first = answers[0]
    u = first.usage or s.EngineUsage()
    completion = sum(a.usage.completion_tokens for a in answers if a.usage is not None)
    usage = WholeUsage(
        u.prompt_tokens,
        completion,
        u.prompt_tokens + completion,
        u.prompt_tokens_details if u.prompt_tokens_details is not None else UNSET,
    )
    choices: list[ChatChoice] | list[TextChoice]
    if chat:
        choices = [
            ChatChoice(j, _message(a), a.logprobs_raw(), a.finish_reason)
            for j, a in enumerate(answers)
        ]
    else:
        choices = [
            TextChoice(a.text, j, a.logprobs_raw(), a.finish_reason) for j, a in enumerate(answers)
        ]
    out = WholeAnswer(
        first.id,
        "chat.completion" if chat else "text_completion",
        first.created,
        model,
        choices,
        usage,
        first.system_fingerprint if first.system_fingerprint is not None else UNSET,
    )
    return _encode(out)
