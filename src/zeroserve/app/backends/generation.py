"""One choice of a ``local`` model's answer: its ``generate``'s text pieces, a finish
reason, token counts (an :class:`~..chat.Output`).

Finish reason
-------------
The runtime's ``Stream`` is an iterator of pieces; a model's ``generate`` may *return*
its finish reason (``tinyllm`` does), which the stream's ``finish_reason`` reports where
the executor forwards it; that value is used when there is one.
Otherwise it is derived: ``"length"`` when the generation used its whole token budget,
``"stop"`` otherwise (end of text, or a stop sequence). The budget is ``max_tokens``,
capped by what is left of the model's context after the prompt. The tokens generated
are estimated as ``max(pieces received, model.count_tokens(text))``: every piece holds at
least one token, and re-tokenising the text recovers the count when pieces merged
tokens (UTF-8 characters spanning tokens, text held back around a stop string);
capped by the budget, which no model exceeds (a sampled text can re-tokenise into more
tokens than were generated, as ``tinyllm``'s sometimes does). The estimate can only err when a model's re-tokenisation is shorter than what it generated
and it stopped on its own right at the budget; ``completion_tokens`` uses the same count.

Stop sequences
--------------
Models receive ``stop`` and should honour it (``tinyllm`` does, token by token), but a
model that ignores it must not break the API: :class:`StopFilter` applies the stop
sequences to the text as it passes. It holds back only a tail that could still become a
stop sequence, so pieces stay as prompt as the model's, and it costs nothing when no
stop sequence is given. A match ends the generation with ``"stop"``, and the string
matched is the finish's ``stop_sequence`` (a request that must report it,
``ChatRequest.report_stop``, leaves the stop strings to the filter: a model that
honours them itself would end with ``"stop"`` and not say which).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from ...models.base import Model
from ...runtime import Stream
from ..chat import Finish
from ..openai.telemetry import GenerationTimer

log = logging.getLogger("zeroserve.openai")


def count_tokens(meta: Model, text: str) -> int:
    """``meta.count_tokens(text)``; whitespace words if the metadata model cannot count
    (a ``process`` model whose metadata instance was never loaded)."""
    try:
        return int(meta.count_tokens(text))
    except Exception:
        log.debug("count_tokens failed on %s; counting words", type(meta).__name__)
        return len(text.split())


def as_text(piece: Any) -> str:
    if isinstance(piece, str):
        return piece
    return bytes(piece).decode("utf-8", "replace")


class StopFilter:
    """Cuts a text stream before the first occurrence of any stop sequence."""

    __slots__ = ("_longest", "_pending", "_stops", "matched", "stopped")

    def __init__(self, stops: list[str]) -> None:
        self._stops = [x for x in stops if x]
        self._longest = max((len(x) for x in self._stops), default=0)
        self._pending = ""
        self.stopped = False
        self.matched: str | None = None  # the stop sequence that ended the text

    def push(self, text: str) -> str:
        """Text that is safe to emit now (possibly empty)."""
        buf = self._pending + text
        found = [(i, x) for x in self._stops if (i := buf.find(x)) >= 0]
        if found:
            cut, self.matched = min(found, key=lambda f: f[0])
            self.stopped = True
            self._pending = ""
            return buf[:cut]
        hold = 0
        for n in range(min(self._longest - 1, len(buf)), 0, -1):
            tail = buf[-n:]
            if any(x.startswith(tail) for x in self._stops):
                hold = n
                break
        self._pending = buf[len(buf) - hold :] if hold else ""
        return buf[: len(buf) - hold]

    def flush(self) -> str:
        out, self._pending = self._pending, ""
        return out


class Generation:
    """Wraps one runtime stream: iterate it for ``str`` pieces, then call :meth:`finish`
    (an :class:`~..chat.Output`).

    ``pieces`` keeps references to the received strings (no copy) so the completion can
    be counted once at the end.
    """

    __slots__ = (
        "_budget",
        "_debited",
        "_done",
        "_filter",
        "_meta",
        "_on_tokens",
        "_stream",
        "_tokens",
        "index",
        "parts",
        "prompt_tokens",
        "timer",
    )

    def __init__(
        self,
        stream: Stream,
        meta: Model,
        *,
        index: int,
        max_tokens: int | None,
        prompt_tokens: int,
        stop: list[str] | None = None,
        on_tokens: Callable[[int], None] | None = None,
        model: str | None = None,
    ) -> None:
        self._stream = stream
        # Told of completion tokens as they arrive (one per piece, the rest once counted
        # at the end): an API key's tokens-per-minute quota is debited while streaming.
        self._on_tokens = on_tokens
        self._debited = 0
        # TTFT, inter-token times and tokens of a served model (app/openai/telemetry.py).
        self.timer = GenerationTimer(model) if model is not None else None
        self._filter = StopFilter(stop) if stop else None
        self._done = False
        self._tokens = 0  # model pieces received (each holds at least one token)
        self._meta = meta
        self.index = index
        self.prompt_tokens = prompt_tokens
        self.parts: list[str] = []
        budget = max_tokens
        ctx = meta.context_length
        if ctx is not None:
            room = max(ctx - prompt_tokens, 0)
            budget = room if budget is None else min(budget, room)
        self._budget = budget

    def __aiter__(self) -> Generation:
        return self

    async def __anext__(self) -> str:
        filt = self._filter
        while not self._done:
            try:
                piece = await self._stream.__anext__()
            except StopAsyncIteration:
                self._done = True
                text = filt.flush() if filt is not None else ""
            else:
                self._tokens += 1
                if self._on_tokens is not None:
                    self._debit(1)
                if self.timer is not None:
                    self.timer.token()
                text = as_text(piece)
                if filt is not None:
                    text = filt.push(text)
                    if filt.stopped:
                        self._done = True
                        await self._stream.aclose()
            if text:
                self.parts.append(text)
                return text
        raise StopAsyncIteration

    def take_ready(self, max_items: int) -> list[str]:
        """Texts of pieces the model has ready right now, without waiting (what the
        writer sends in the same write). Stops short of the end of the stream, which
        ``__anext__`` reports; with stop strings it takes nothing (the filter decides
        piece by piece)."""
        if self._done or self._filter is not None:
            return []
        pieces = self._stream.receive_batch_nowait(max_items)
        self._tokens += len(pieces)
        if self._on_tokens is not None and pieces:
            self._debit(len(pieces))
        if self.timer is not None:
            self.timer.tokens(len(pieces))
        texts = [t for t in map(as_text, pieces) if t]
        self.parts += texts
        return texts

    async def aclose(self) -> None:
        await self._stream.aclose()
        if self.timer is not None and not self._done:  # cut short: what it made so far
            self.timer.observe(self._tokens, prompt_tokens=self.prompt_tokens)

    def text(self) -> str:
        return "".join(self.parts)

    def tokens_so_far(self) -> tuple[int, int]:
        """The prompt's tokens and the pieces received (one token or more each)."""
        return self.prompt_tokens, self._tokens

    def _debit(self, n: int) -> None:
        assert self._on_tokens is not None
        self._debited += n
        self._on_tokens(n)

    def finish(self) -> Finish:
        """Why the stream ended and its tokens, once it has ended."""
        reason, tokens = self._finish()
        if self._on_tokens is not None and tokens > self._debited:
            self._debit(tokens - self._debited)
        if self.timer is not None:
            self.timer.observe(tokens, prompt_tokens=self.prompt_tokens)
        filt = self._filter
        matched = filt.matched if filt is not None else None
        return Finish(reason, tokens, self.prompt_tokens, stop_sequence=matched)

    def _finish(self) -> tuple[str, int]:
        pieces = self._tokens
        if self._filter is not None and self._filter.stopped:
            return "stop", max(pieces, count_tokens(self._meta, self.text()) if pieces else 0)
        reason = self._stream.finish_reason
        budget = self._budget
        if reason is None and budget is not None and pieces >= budget:
            # The common "length" case needs no re-tokenisation (echo, ASCII text).
            return "length", pieces
        tokens = max(pieces, count_tokens(self._meta, self.text()) if pieces else 0)
        if budget is not None:  # no model makes more: re-tokenising can merge fewer
            tokens = min(tokens, max(budget, pieces))
        if reason is None:
            reason = "length" if budget is not None and tokens >= budget else "stop"
        return str(reason), tokens
