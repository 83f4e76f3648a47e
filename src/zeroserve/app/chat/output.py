"""One choice of an answer as a backend produces it (docs/architecture.md, "One chat
path").

An :class:`Output` is an async iterator of pieces: a ``str`` is text (the common case,
kept a plain string so that a token costs no object), a :class:`DeltaPiece` anything else (a
tool call's name or arguments, reasoning text, text with its log probabilities). Once it
has ended, :meth:`Output.finish` says why and how many tokens it took. Front ends write
the pieces in their API's shape as they come (a stream) or :func:`collect` them into one
:class:`Collected` answer (a whole response). An output owns its admission ticket and
releases it once, when it ends or is closed, like every stream (docs/architecture.md,
"Stream classes").
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Sequence
from typing import Protocol

import msgspec

from ...runtime.channel import PULL_YIELD_EVERY
from .request import ToolCall


class CallDelta:
    """A fragment of the ``index``-th tool call of an answer: the first names it (``id``
    and ``name``), later ones add to its ``arguments``."""

    __slots__ = ("arguments", "id", "index", "name")

    def __init__(
        self, index: int, arguments: str = "", *, id: str | None = None, name: str | None = None
    ) -> None:
        self.index = index
        self.id = id
        self.name = name
        self.arguments = arguments


class DeltaPiece:
    """A piece that is not plain text. ``logprobs``: one entry per token of ``text``, in
    OpenAI's chat shape (``{"token", "logprob", "bytes", "top_logprobs"}``), as the
    engine wrote it."""

    __slots__ = ("call", "logprobs", "reasoning", "text")

    def __init__(
        self,
        text: str | None = None,
        *,
        reasoning: str | None = None,
        call: CallDelta | None = None,
        logprobs: list[msgspec.Raw] | None = None,
    ) -> None:
        self.text = text
        self.reasoning = reasoning
        self.call = call
        self.logprobs = logprobs


Piece = str | DeltaPiece


class Finish:
    """Why a choice ended (``stop``, ``length`` or ``tool_calls``) and its tokens:
    ``prompt_tokens`` of its prompt (``cached_tokens`` of them served from a prompt
    cache, None where the backend has none), ``completion_tokens`` generated;
    ``stop_sequence``: the stop string that ended it, where the request asked
    (``ChatRequest.report_stop``) and one did. A plain class: a frozen dataclass's
    ``__init__`` sets each field through ``object.__setattr__``."""

    __slots__ = ("cached_tokens", "completion_tokens", "prompt_tokens", "reason", "stop_sequence")

    def __init__(
        self,
        reason: str,
        completion_tokens: int,
        prompt_tokens: int,
        cached_tokens: int | None = None,
        stop_sequence: str | None = None,
    ) -> None:
        self.reason = reason
        self.completion_tokens = completion_tokens
        self.prompt_tokens = prompt_tokens
        self.cached_tokens = cached_tokens
        self.stop_sequence = stop_sequence


class Output(Protocol):
    """One choice of an answer (the backend's side of every front end)."""

    @property
    def index(self) -> int:
        """The choice's place in the answer (prompt-major: prompt ``i``, choice ``j`` of
        ``n`` is ``i * n + j``)."""
        ...

    def __aiter__(self) -> Output: ...

    def __anext__(self) -> Awaitable[Piece]:
        """The next piece (waits); ``StopAsyncIteration`` at the end; errors after the
        pieces before them."""
        ...

    def take_ready(self, max_items: int) -> Sequence[Piece]:
        """Pieces ready now, up to ``max_items``, without waiting (possibly none); the
        end and errors are left for ``__anext__``."""
        ...

    async def aclose(self) -> None:
        """Stop early, or clean up after the end: releases what the output owns."""
        ...

    def tokens_so_far(self) -> tuple[int, int]:
        """Its prompt's tokens and the tokens generated so far, as far as known now (a
        stream's usage on every chunk: vLLM's ``continuous_usage_stats``)."""
        ...

    def finish(self) -> Finish:
        """Why it ended and its tokens (after the end)."""
        ...


class Collected:
    """A whole choice, put together from its pieces."""

    __slots__ = ("calls", "finish", "index", "logprobs", "parts", "reasoning")

    def __init__(self, index: int) -> None:
        self.index = index
        self.parts: list[str] = []
        self.reasoning: list[str] = []
        self.calls: dict[int, tuple[list[str], list[str]]] = {}  # index -> (id+name, args)
        self.logprobs: list[msgspec.Raw] | None = None
        self.finish: Finish | None = None

    @property
    def text(self) -> str:
        return "".join(self.parts)

    def add(self, piece: Piece) -> None:
        if type(piece) is str:
            self.parts.append(piece)
            return
        assert isinstance(piece, DeltaPiece)
        if piece.text:
            self.parts.append(piece.text)
        if piece.reasoning:
            self.reasoning.append(piece.reasoning)
        if piece.logprobs is not None:
            if self.logprobs is None:
                self.logprobs = []
            self.logprobs += piece.logprobs
        call = piece.call
        if call is not None:
            head, args = self.calls.setdefault(call.index, (["", ""], []))
            head[0] = call.id or head[0]
            head[1] = call.name or head[1]
            if call.arguments:
                args.append(call.arguments)

    def tool_calls(self) -> list[ToolCall]:
        return [
            ToolCall(id=head[0], name=head[1], arguments="".join(args))
            for _, (head, args) in sorted(self.calls.items())
        ]

    def logprobs_raw(self) -> msgspec.Raw | None:
        """The log probabilities as OpenAI's ``{"content": [...]}`` (None: not asked)."""
        if self.logprobs is None:
            return None
        return msgspec.Raw(b'{"content":[' + b",".join(bytes(r) for r in self.logprobs) + b"]}")


async def collect(output: Output) -> Collected:
    """Every piece of ``output``, read into one answer; the output is closed however
    this ends (which stops its generation if it still runs)."""
    out = Collected(output.index)
    parts = out.parts  # text pieces go straight here: the common case, one append each
    failure: BaseException | None = None
    try:
        while True:
            try:
                piece = await output.__anext__()
            except StopAsyncIteration:
                break
            if isinstance(piece, str):
                parts.append(piece)
            else:
                out.add(piece)
            # Then what the model has ready, a batch per call (a sync inline model's
            # generator makes it in the call): not one await per token. The loop gets a
            # turn between full batches, as a pulled channel's consumer gives it.
            while True:
                ready = output.take_ready(_READY_BATCH)
                for p in ready:
                    if isinstance(p, str):
                        parts.append(p)
                    else:
                        out.add(p)
                if len(ready) < _READY_BATCH:
                    break
                await asyncio.sleep(0)
    except BaseException as exc:
        failure = exc
    # No await in an ``except`` or ``finally``: compiled code must not suspend in a
    # handler (docs/decisions/0009-no-await-in-handlers-when-compiled.md).
    await output.aclose()
    if failure is not None:
        raise failure
    out.finish = output.finish()
    return out


# Pieces taken per call while collecting (the runtime's PULL_YIELD_EVERY).
_READY_BATCH = PULL_YIELD_EVERY
