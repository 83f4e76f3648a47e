"""One generation as the OpenAI layer sees it: text pieces, a finish reason, token counts.

Finish reason
-------------
The runtime's ``Stream`` is an iterator of pieces; a model's ``generate`` may *return*
its finish reason (``tinyllm`` does), but that value does not cross the executor. When
the stream exposes ``finish_reason`` (a runtime that forwards it), that value is used.
Otherwise it is derived: ``"length"`` when the generation used its whole token budget,
``"stop"`` otherwise (end of text, or a stop sequence). The budget is ``max_tokens``,
capped by what is left of the model's context after the prompt. The tokens generated
are estimated as ``max(pieces received, model.count_tokens(text))``: every piece holds at
least one token, and re-tokenising the text recovers the count when pieces merged
tokens (UTF-8 characters spanning tokens, text held back around a stop string). The
estimate can only err when a model's re-tokenisation is shorter than what it generated
and it stopped on its own right at the budget; ``completion_tokens`` uses the same count.
"""

from __future__ import annotations

import logging
from typing import Any

from ...models.base import Model

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


class Generation:
    """Wraps one runtime stream: iterate it for ``str`` pieces, then call :meth:`finish`.

    ``pieces`` keeps references to the received strings (no copy) so the completion can
    be counted once at the end.
    """

    __slots__ = ("_budget", "_meta", "_stream", "index", "parts", "prompt_tokens")

    def __init__(
        self,
        stream: Any,
        meta: Model,
        *,
        index: int,
        max_tokens: int | None,
        prompt_tokens: int,
    ) -> None:
        self._stream = stream
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
        while True:
            text = as_text(await self._stream.__anext__())
            if text:
                self.parts.append(text)
                return text

    async def aclose(self) -> None:
        await self._stream.aclose()

    def text(self) -> str:
        return "".join(self.parts)

    def finish(self) -> tuple[str, int]:
        """``(finish_reason, completion_tokens)`` once the stream has ended."""
        pieces = len(self.parts)
        reason = getattr(self._stream, "finish_reason", None)
        budget = self._budget
        if reason is None and budget is not None and pieces >= budget:
            # The common "length" case needs no re-tokenisation (echo, ASCII text).
            return "length", pieces
        tokens = max(pieces, count_tokens(self._meta, self.text()) if pieces else 0)
        if reason is None:
            reason = "length" if budget is not None and tokens >= budget else "stop"
        return str(reason), tokens
