"""Generation metrics, the same for every generative model (generic path and engine).

* ``zeroserve_generation_ttft_seconds{model}``: from the request admitted to its first
  token (queueing included: what a client waits);
* ``zeroserve_generation_inter_token_seconds{model}``: between consecutive tokens as they
  reach the writer (pieces that arrive together count as arriving together);
* ``zeroserve_generation_tokens_total{model}``: tokens generated (``rate()`` is tokens/s);
* ``zeroserve_generation_prompt_tokens_total`` and ``..._prompt_cache_hit_tokens_total``:
  prompt tokens, and those the engine served from its prompt cache (engines that say).

Timestamps are taken as tokens arrive (one ``perf_counter`` and a list append each) and
observed once, when the generation ends, so the hot path takes no histogram lock.
"""

from __future__ import annotations

import itertools
import time

from prometheus_client import Counter, Histogram

from ... import metrics

TTFT_SECONDS = Histogram(
    "zeroserve_generation_ttft_seconds",
    "Time from a generation request admitted to its first token (queueing included).",
    ["model"],
    registry=metrics.REGISTRY,
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60),
)
ITL_SECONDS = Histogram(
    "zeroserve_generation_inter_token_seconds",
    "Time between consecutive tokens (pieces) of a generation.",
    ["model"],
    registry=metrics.REGISTRY,
    buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5),
)
TOKENS = Counter(
    "zeroserve_generation_tokens",
    "Tokens generated (rate() of it is tokens/s).",
    ["model"],
    registry=metrics.REGISTRY,
)
PROMPT_TOKENS = Counter(
    "zeroserve_generation_prompt_tokens",
    "Prompt tokens of generation requests (cached or evaluated).",
    ["model"],
    registry=metrics.REGISTRY,
)
CACHED_PROMPT_TOKENS = Counter(
    "zeroserve_generation_prompt_cache_hit_tokens",
    "Prompt tokens served from the engine's prompt cache instead of being evaluated.",
    ["model"],
    registry=metrics.REGISTRY,
)


class GenerationTimer:
    """The timestamps of one generation's tokens; :meth:`observe` records them once."""

    __slots__ = ("model", "observed", "stamps", "t0")

    def __init__(self, model: str) -> None:
        self.model = model
        self.t0 = time.perf_counter()
        self.stamps: list[float] = []
        self.observed = False

    def token(self) -> None:
        self.stamps.append(time.perf_counter())

    def observe(
        self, tokens: int | None = None, *, prompt_tokens: int = 0, cached_tokens: int = 0
    ) -> None:
        """Record the generation (once): ``tokens`` generated (default: one per stamp)."""
        if self.observed:
            return
        self.observed = True
        stamps = self.stamps
        if stamps:
            TTFT_SECONDS.labels(self.model).observe(stamps[0] - self.t0)
            itl = ITL_SECONDS.labels(self.model)
            for a, b in itertools.pairwise(stamps):
                itl.observe(b - a)
        made = len(stamps) if tokens is None else tokens
        if made:
            TOKENS.labels(self.model).inc(made)
        if prompt_tokens:
            PROMPT_TOKENS.labels(self.model).inc(prompt_tokens)
        if cached_tokens:
            CACHED_PROMPT_TOKENS.labels(self.model).inc(cached_tokens)
