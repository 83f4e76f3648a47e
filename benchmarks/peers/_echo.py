"""The echo model's generation rule, shared by the peers (mirrors ``models/echo.py``)."""

from __future__ import annotations

from collections.abc import Iterator


def echo_tokens(prompt: str, max_tokens: int | None) -> Iterator[str]:
    """The prompt's whitespace-separated tokens, cycled up to ``max_tokens`` (once through
    without a limit); each token after the first is preceded by one space."""
    tokens = prompt.split()
    if not tokens:
        return
    produced = 0
    while max_tokens is None or produced < max_tokens:
        for tok in tokens:
            if max_tokens is not None and produced >= max_tokens:
                return
            yield tok if produced == 0 else " " + tok
            produced += 1
        if max_tokens is None:
            return
