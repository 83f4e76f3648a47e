"""Generation metrics, the same for every generative model (generic path and engine).

* ``zeroserve_generation_ttft_seconds{model}``: from the request admitted to its first
  token (queueing included: what a client waits);
* ``zeroserve_generation_inter_token_seconds{model}``: between consecutive tokens as they
  reach the writer (pieces that arrive together count as arriving together);
* ``zeroserve_generation_tokens_total{model}``: tokens generated (``rate()`` is tokens/s);
* ``zeroserve_generation_prompt_tokens_total`` and ``..._prompt_cache_hit_tokens_total``:
  prompt tokens, and those the engine served from its prompt cache (engines that say).

Timestamps are taken per delivery, not per token: the writer takes every ready piece at
once (``tokens(n)``: one ``perf_counter``, the ``n - 1`` pieces after the first arrive
together, a gap of 0). They are observed once, when the generation ends, into lock-free
histograms (``metrics.Latency``, one bisect per distinct gap, ``n`` zeros in one bump)
that a collector exposes at scrape time: a prometheus-client ``Histogram`` takes a lock
and walks its buckets per observation, which at one observation per token was most of
an OpenAI stream's CPU.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

from prometheus_client import Counter
from prometheus_client.core import HistogramMetricFamily, Metric

from ... import metrics

# Time to first token: from queueing on a CPU model's long prompt down to echo's 5 ms.
TTFT_BUCKETS_S = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)
# Inter-token time: half a millisecond (an engine's fast decode) up to stalls of seconds.
ITL_BUCKETS_S = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5)
_ttft: dict[str, metrics.Latency] = {}
_itl: dict[str, metrics.Latency] = {}


def _latency(
    table: dict[str, metrics.Latency], model: str, bounds: tuple[float, ...]
) -> metrics.Latency:
    found = table.get(model)
    if found is None:
        found = table[model] = metrics.Latency(bounds)
    return found


class _Histograms:
    """Exposes the lock-free TTFT and inter-token histograms at scrape time."""

    def collect(self) -> Iterator[Metric]:
        for name, doc, table in (
            (
                "zeroserve_generation_ttft_seconds",
                "Time from a generation request admitted to its first token (queueing included).",
                _ttft,
            ),
            (
                "zeroserve_generation_inter_token_seconds",
                "Time between consecutive tokens (pieces) of a generation.",
                _itl,
            ),
        ):
            family = HistogramMetricFamily(name, doc, labels=["model"])
            for model, latency in sorted(table.items()):
                snap = latency.snapshot()
                cumulative, buckets = 0, []
                for bound, n in zip((*snap.bounds, float("inf")), snap.counts, strict=True):
                    cumulative += n
                    buckets.append((_bound(bound), cumulative))
                family.add_metric([model], buckets, snap.sum)
            yield family


def _bound(bound: float) -> str:
    return "+Inf" if bound == float("inf") else repr(float(bound))


metrics.REGISTRY.register(_Histograms())  # type: ignore[arg-type]
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
    """The arrival times of one generation's tokens; :meth:`observe` records them once."""

    __slots__ = ("_count", "_first", "_gaps", "_last", "_together", "model", "observed", "t0")

    def __init__(self, model: str) -> None:
        self.model = model
        self.t0 = time.perf_counter()
        self._first = 0.0  # seconds from t0 to the first token
        self._last = 0.0  # when the last delivery arrived
        self._gaps: list[float] = []  # between deliveries
        self._together = 0  # tokens that arrived with the one before them (gap 0)
        self._count = 0  # tokens timed
        self.observed = False

    @property
    def count(self) -> int:
        """Tokens timed so far."""
        return self._count

    def token(self) -> None:
        self.tokens(1)

    def tokens(self, n: int) -> None:
        """``n`` tokens arrived together, now."""
        if n <= 0:
            return
        now = time.perf_counter()
        if self._count:
            self._gaps.append(now - self._last)
        else:
            self._first = now - self.t0
        self._last = now
        self._together += n - 1
        self._count += n

    def observe(
        self, tokens: int | None = None, *, prompt_tokens: int = 0, cached_tokens: int = 0
    ) -> None:
        """Record the generation (once): ``tokens`` generated (default: one per timed
        token)."""
        if self.observed:
            return
        self.observed = True
        model = self.model
        if self._count:
            _latency(_ttft, model, TTFT_BUCKETS_S).observe(self._first)
            itl = _latency(_itl, model, ITL_BUCKETS_S)
            for gap in self._gaps:
                itl.observe(gap)
            if self._together:
                itl.observe(0.0, self._together)
        made = self._count if tokens is None else tokens
        if made:
            TOKENS.labels(model).inc(made)
        if prompt_tokens:
            PROMPT_TOKENS.labels(model).inc(prompt_tokens)
        if cached_tokens:
            CACHED_PROMPT_TOKENS.labels(model).inc(cached_tokens)
