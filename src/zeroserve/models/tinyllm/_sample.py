"""The next token of one ``tinyllm`` generation: greedy or sampled, with vLLM's sampling
extensions.

Order, as vLLM applies them: the repetition penalty on the logits (a token already in
the prompt or the answer has a positive logit divided by the penalty, a negative one
multiplied); the end tokens masked while the answer may not end (``ignore_eos``, or
fewer than ``min_tokens`` tokens so far); then greedy at temperature 0, else the
softmax at that temperature cut to the ``top_k`` likeliest tokens, then to those at
least ``min_p`` times as likely as the likeliest, then to the smallest set whose
probability reaches ``top_p``, drawn from ``numpy.random.default_rng(seed)``.
``top_k`` 1 is greedy at any temperature. A request that gives none of the extensions
costs what the plain sampler costs (no copy of the logits beyond the softmax's).
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np

from ..base import GenerateRequest


class Sampler:
    """Chooses one generation's tokens; owned by that generation (not thread-safe)."""

    __slots__ = (
        "_end",
        "_ends_from",
        "_min_p",
        "_penalty",
        "_rng",
        "_seen",
        "_temperature",
        "_top_k",
        "_top_p",
    )

    def __init__(
        self,
        req: GenerateRequest,
        vocab: int,
        end_ids: Iterable[int],
        prompt_ids: Iterable[int],
    ) -> None:
        self._temperature = req.temperature
        self._top_p = req.top_p
        self._top_k = req.top_k if req.top_k is not None and req.top_k > 0 else 0
        self._min_p = req.min_p
        self._penalty = req.repetition_penalty
        self._rng = (
            np.random.default_rng(req.seed) if req.temperature > 0 and self._top_k != 1 else None
        )
        self._end = np.fromiter(end_ids, dtype=np.intp)
        # The first token that may be an end token (None: never, with ignore_eos).
        self._ends_from: int | None = None if req.ignore_eos else max(req.min_tokens, 0)
        self._seen: np.ndarray | None = None
        if self._penalty != 1.0:
            self._seen = np.zeros(vocab, dtype=bool)
            self._seen[np.fromiter(prompt_ids, dtype=np.intp)] = True

    def next(self, logits: np.ndarray, produced: int) -> int:
        """The token after ``produced`` tokens of the answer, from the model's ``logits``."""
        if self._seen is not None or self._ends_from is None or produced < self._ends_from:
            logits = np.array(logits, dtype=np.float64)
            seen = self._seen
            if seen is not None:
                x = logits[seen]
                logits[seen] = np.where(x > 0, x / self._penalty, x * self._penalty)
            if self._ends_from is None or produced < self._ends_from:
                logits[self._end] = -np.inf
        tok = self._choose(logits)
        if self._seen is not None:
            self._seen[tok] = True
        return tok

    def _choose(self, logits: np.ndarray) -> int:
        rng = self._rng
        if rng is None:  # temperature 0, or top_k 1
            return int(np.argmax(logits))
        z = logits.astype(np.float64) / self._temperature
        z -= z.max()
        p = np.exp(z)
        p /= p.sum()
        if self._top_k or self._min_p > 0 or self._top_p < 1.0:
            order = np.argsort(-p, kind="stable")
            keep = len(order)
            if self._top_k:
                keep = min(keep, self._top_k)
            if self._min_p > 0:
                keep = min(keep, int(np.count_nonzero(p >= self._min_p * p[order[0]])))
            order = order[:keep]
            cum = np.cumsum(p[order])
            if self._top_p < 1.0:  # of what the cuts above kept (renormalised)
                mass = cum[-1] if keep < len(p) else 1.0
                keep = min(keep, int(np.searchsorted(cum, max(self._top_p, 0.0) * mass)) + 1)
                order, cum = order[:keep], cum[:keep]
            i = int(np.searchsorted(cum, rng.random() * cum[-1], "right"))
            return int(order[min(i, keep - 1)])
        cum = np.cumsum(p)
        return int(min(int(np.searchsorted(cum, rng.random() * cum[-1], "right")), len(p) - 1))
