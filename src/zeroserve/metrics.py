"""Counters, histograms and the Prometheus exposition.

Hot-path counters (copied bytes, payload bytes) are plain integers in a dict, bumped
without locks or label lookups (a prometheus-client ``Counter.labels().inc()`` costs a
lock and a dict walk per call); a custom collector exposes them at scrape time.
Components with queues publish immutable ``statistics()`` snapshots through
``register_source``; ``/metrics`` reads those snapshots and never reaches inside objects.
"""

from __future__ import annotations

import dataclasses
from bisect import bisect_left
from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

from prometheus_client import CollectorRegistry, Histogram, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)

REGISTRY = CollectorRegistry(auto_describe=False)

_copied: defaultdict[str, int] = defaultdict(int)
_payload: defaultdict[str, int] = defaultdict(int)
_requests: defaultdict[tuple[str, str], int] = defaultdict(int)
_sources: dict[str, _Source] = {}


@dataclasses.dataclass(frozen=True, slots=True)
class _Source:
    statistics: Callable[[], Any]
    counters: frozenset[str]
    label: str | tuple[str, ...]
    names: Mapping[str, str]


def count_copy(site: str, nbytes: int) -> None:
    """Record that ``nbytes`` of payload were copied at ``site`` (a short stable name)."""
    _copied[site] += nbytes


def count_payload(direction: str, nbytes: int) -> None:
    """Record payload bytes received (``"in"``) or sent (``"out"``)."""
    _payload[direction] += nbytes


def count_request(route: str, status: int) -> None:
    _requests[(route, str(status))] += 1


def copied_bytes(site: str | None = None) -> int:
    return sum(_copied.values()) if site is None else _copied.get(site, 0)


def payload_bytes(direction: str) -> int:
    return _payload.get(direction, 0)


# Bucket bounds (seconds) of time to first token and inter-token time: from tens of
# microseconds (echo on the loop) to tens of seconds (a long prompt on a CPU model).
TOKEN_BUCKETS_S = (
    0.00005,
    0.0001,
    0.00025,
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
)


@dataclasses.dataclass(frozen=True, slots=True)
class LatencySnapshot:
    """A histogram's state: ``counts[i]`` values fell at or below ``bounds[i]`` (and above
    the bound before); the last count is above every bound (``+Inf``)."""

    bounds: tuple[float, ...]
    counts: tuple[int, ...]
    count: int
    sum: float


class Latency:
    """A histogram bumped on the event loop without locks (prometheus-client's Histogram
    takes a lock per observation; this is per streamed piece, so it stays a list bump)."""

    __slots__ = ("bounds", "count", "counts", "sum")

    def __init__(self, bounds: tuple[float, ...] = TOKEN_BUCKETS_S) -> None:
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)
        self.count = 0
        self.sum = 0.0

    def observe(self, seconds: float, n: int = 1) -> None:
        """Record ``n`` observations of ``seconds``."""
        self.counts[bisect_left(self.bounds, seconds)] += n
        self.count += n
        self.sum += seconds * n

    def snapshot(self) -> LatencySnapshot:
        return LatencySnapshot(self.bounds, tuple(self.counts), self.count, self.sum)


class GenerationMetrics:
    """One model's streaming latencies: time to first piece, time between pieces, and
    the pieces delivered (a piece is what a model yields: one token for echo and LLMs)."""

    __slots__ = ("first_piece", "inter_piece", "pieces")

    def __init__(self) -> None:
        self.first_piece = Latency()
        self.inter_piece = Latency()
        self.pieces = 0


_generation: dict[str, GenerationMetrics] = {}


def generation_metrics(model: str) -> GenerationMetrics:
    """The streaming latency recorder of ``model`` (made on first use, kept for the
    process's life so counters stay monotonic across engine restarts)."""
    found = _generation.get(model)
    if found is None:
        found = _generation[model] = GenerationMetrics()
    return found


def register_source(
    name: str,
    statistics: Callable[[], Any],
    *,
    counters: Iterable[str] = (),
    label: str | tuple[str, ...] = "name",
    names: Mapping[str, str] | None = None,
) -> None:
    """Publish a component's ``statistics()`` (a dataclass or a mapping of numbers, or a
    mapping of label value -> such, labelled ``label``) as metrics named
    ``zeroserve_<name>_<field>``: gauges, except the cumulative fields named in
    ``counters``, which are counters exposed as ``zeroserve_<name>_<field>_total``.
    ``label`` a tuple of names: ``statistics()`` is as many mappings deep, one label value
    per level (``{model: {class: snapshot}}`` for ``("name", "class")``).
    ``names`` renames fields on the way out, to put their unit in the name
    (``{"used": "used_bytes"}``), as Prometheus conventions ask."""
    _sources[name] = _Source(statistics, frozenset(counters), label, names or {})


def unregister_source(name: str) -> None:
    _sources.pop(name, None)


def _fields(snapshot: Any) -> dict[str, Any]:
    if dataclasses.is_dataclass(snapshot) and not isinstance(snapshot, type):
        return dataclasses.asdict(snapshot)
    if isinstance(snapshot, dict):
        return snapshot
    return {}


class _SourceCollector:
    def collect(self) -> Iterator[Metric]:
        c = CounterMetricFamily(
            "zeroserve_copied_bytes",
            "Payload bytes copied inside the server, by site.",
            labels=["site"],
        )
        for site, n in sorted(_copied.items()):
            c.add_metric([site], n)
        yield c
        p = CounterMetricFamily(
            "zeroserve_payload_bytes", "Payload bytes received and sent.", labels=["direction"]
        )
        for d in ("in", "out"):
            p.add_metric([d], _payload.get(d, 0))
        yield p
        r = CounterMetricFamily(
            "zeroserve_http_requests",
            "HTTP responses, by route and status.",
            labels=["route", "status"],
        )
        for (route, status), n in sorted(_requests.items()):
            r.add_metric([route, status], n)
        yield r
        yield _request_family()
        yield from _generation_families()
        for name, source in list(_sources.items()):
            yield from _families(name, source, source.statistics())


def _generation_families() -> Iterator[Metric]:
    ttft = HistogramMetricFamily(
        "zeroserve_stream_first_piece_seconds",
        "From the start of a generation to its first piece handed to the response writer.",
        labels=["model"],
    )
    itl = HistogramMetricFamily(
        "zeroserve_stream_inter_piece_seconds",
        "Time between pieces handed to the response writer (a delivery of k ready pieces "
        "counts k gaps of 1/k of its wait).",
        labels=["model"],
    )
    pieces = CounterMetricFamily(
        "zeroserve_stream_pieces", "Pieces (tokens) engine streams delivered.", labels=["model"]
    )
    for model, gen in sorted(_generation.items()):
        for family, latency in ((ttft, gen.first_piece), (itl, gen.inter_piece)):
            snap = latency.snapshot()
            cumulative, buckets = 0, []
            for bound, n in zip((*snap.bounds, float("inf")), snap.counts, strict=True):
                cumulative += n
                buckets.append(("+Inf" if bound == float("inf") else repr(bound), cumulative))
            family.add_metric([model], buckets, snap.sum)
        pieces.add_metric([model], gen.pieces)
    yield ttft
    yield itl
    yield pieces


def _family(name: str, key: str, source: _Source, labels: list[str] | None) -> Metric:
    metric = f"zeroserve_{name}_{source.names.get(key, key)}"
    if key in source.counters:
        return CounterMetricFamily(metric, f"{name} {key}", labels=labels)
    return GaugeMetricFamily(metric, f"{name} {key}", labels=labels)


def _labelled(value: Any, depth: int) -> Iterator[tuple[list[str], Any]]:
    """(label values, snapshot) pairs of a mapping ``depth`` levels deep."""
    if depth == 0:
        yield [], value
        return
    for label, sub in value.items():
        for rest, snap in _labelled(sub, depth - 1):
            yield [str(label), *rest], snap


def _families(name: str, source: _Source, snapshot: Any) -> Iterable[Metric]:
    if isinstance(source.label, tuple):  # several labels: nested mappings
        labels = list(source.label)
        by_key: dict[str, Metric] = {}
        for values, sub in _labelled(snapshot, len(labels)):
            for key, value in _fields(sub).items():
                if isinstance(value, bool | int | float):
                    fam = by_key.get(key)
                    if fam is None:
                        fam = by_key[key] = _family(name, key, source, labels)
                    fam.add_metric(values, float(value))  # type: ignore[attr-defined]
        yield from by_key.values()
        return
    fields = _fields(snapshot)
    if not fields:
        return
    first = next(iter(fields.values()))
    if isinstance(first, dict) or dataclasses.is_dataclass(first):
        # label value -> snapshot (e.g. one per model)
        families: dict[str, Metric] = {}
        for label, sub in fields.items():
            for key, value in _fields(sub).items():
                if isinstance(value, bool | int | float):
                    fam = families.get(key)
                    if fam is None:
                        fam = families[key] = _family(name, key, source, [source.label])
                    fam.add_metric([str(label)], float(value))  # type: ignore[attr-defined]
        yield from families.values()
        return
    for key, value in fields.items():
        if isinstance(value, bool | int | float):
            fam = _family(name, key, source, None)
            fam.add_metric([], float(value))  # type: ignore[attr-defined]
            yield fam


REGISTRY.register(_SourceCollector())  # type: ignore[arg-type]

# Bucket bounds (seconds) of a request's duration: half a millisecond (echo) to 30 s.
REQUEST_BUCKETS_S = (
    0.0005,
    0.001,
    0.002,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
)
_request_seconds: dict[str, Latency] = {}


def request_timer(route: str) -> Callable[[float], None]:
    """What observes a request's duration on ``route`` (``zeroserve_request_seconds``):
    a lock-free histogram bump, once per request (a prometheus-client ``Histogram`` takes
    a lock and walks its buckets)."""
    found = _request_seconds.get(route)
    if found is None:
        found = _request_seconds[route] = Latency(REQUEST_BUCKETS_S)
    return found.observe


def _request_family() -> Metric:
    family = HistogramMetricFamily(
        "zeroserve_request_seconds",
        "Time from a request's complete head to its last response byte handed to the socket.",
        labels=["route"],
    )
    for route, latency in sorted(_request_seconds.items()):
        family.add_metric([route], *_buckets(latency))
    return family


def _buckets(latency: Latency) -> tuple[list[tuple[str, int]], float]:
    snap = latency.snapshot()
    cumulative, buckets = 0, []
    for bound, n in zip((*snap.bounds, float("inf")), snap.counts, strict=True):
        cumulative += n
        buckets.append(("+Inf" if bound == float("inf") else repr(float(bound)), cumulative))
    return buckets, snap.sum


LOOP_LAG_SECONDS = Histogram(
    "zeroserve_event_loop_lag_seconds",
    "How late the event loop ran a timer scheduled for now: the HTTP stall users feel.",
    registry=REGISTRY,
    buckets=(0.0001, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1),
)


# How long a model took to load at run time (docs/architecture.md, "Models at run time"):
# from an echo model's milliseconds to a large GGUF's minutes.
MODEL_LOAD_SECONDS = Histogram(
    "zeroserve_model_load_seconds",
    "How long each successful load of a model at run time took.",
    ["model"],
    registry=REGISTRY,
    buckets=(0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300),
)


def _labels(sample_labels: Mapping[str, str]) -> dict[str, str]:
    return {k: v for k, v in sample_labels.items() if k != "le"}


def snapshot() -> dict[str, Any]:
    """What ``/metrics`` exposes, as plain data for a JSON view (``/v1/stats``).

    ``counters`` and ``histograms`` come from the registry's own ``collect()`` (the values
    the Prometheus exposition renders), keyed by family name, each a list of labelled
    values; a histogram's ``counts`` are per bucket (``bounds[i]``), the last one above
    every bound. ``sources`` are the registered ``statistics()`` snapshots, whole.
    """
    counters: dict[str, list[dict[str, Any]]] = {}
    histograms: dict[str, list[dict[str, Any]]] = {}
    for family in REGISTRY.collect():
        if family.type == "counter":
            counters[family.name] = [
                {"labels": dict(s.labels), "value": s.value}
                for s in family.samples
                if s.name.endswith("_total")
            ]
        elif family.type == "histogram":
            histograms[family.name] = _histograms(family)
    return {
        "counters": counters,
        "histograms": histograms,
        "sources": {name: source.statistics() for name, source in list(_sources.items())},
    }


def _histograms(family: Metric) -> list[dict[str, Any]]:
    """A histogram family's children as non-cumulative bucket counts."""
    children: dict[tuple[tuple[str, str], ...], dict[str, Any]] = {}
    for sample in family.samples:
        labels = _labels(sample.labels)
        child = children.setdefault(
            tuple(sorted(labels.items())),
            {"labels": labels, "bounds": [], "counts": [], "count": 0, "sum": 0.0},
        )
        if sample.name.endswith("_bucket"):
            le = float(sample.labels["le"])
            child["counts"].append(int(sample.value) - child["count"])
            child["count"] = int(sample.value)
            if le != float("inf"):
                child["bounds"].append(le)
        elif sample.name.endswith("_sum"):
            child["sum"] = sample.value
    return list(children.values())


def exposition() -> bytes:
    """The Prometheus text format of every zeroserve metric."""
    return generate_latest(REGISTRY)


def merge_expositions(texts: Iterable[bytes]) -> bytes:
    """One view of several processes' expositions (``--workers N``): samples with the same
    name and labels are summed (counters, histogram buckets, and gauges, which are then
    totals over the processes: connections open, requests in flight, queue depth);
    ``*_created`` timestamps take the earliest. Adds ``zeroserve_metrics_processes``."""
    from prometheus_client.parser import text_string_to_metric_families

    families: dict[str, Metric] = {}
    values: dict[str, dict[tuple[str, tuple[tuple[str, str], ...]], float]] = {}
    count = 0
    for text in texts:
        count += 1
        for fam in text_string_to_metric_families(text.decode("utf-8")):
            merged = families.get(fam.name)
            if merged is None:
                merged = families[fam.name] = Metric(fam.name, fam.documentation, fam.type)
                values[fam.name] = {}
            acc = values[fam.name]
            for sample in fam.samples:
                key = (sample.name, tuple(sorted(sample.labels.items())))
                old = acc.get(key)
                if old is None:
                    acc[key] = sample.value
                elif sample.name.endswith("_created"):
                    acc[key] = min(old, sample.value)
                else:
                    acc[key] = old + sample.value
    out = CollectorRegistry(auto_describe=False)
    procs = GaugeMetricFamily(
        "zeroserve_metrics_processes", "HTTP processes whose metrics this view sums.", value=count
    )
    for name, fam in families.items():
        for (sample_name, labels), value in values[name].items():
            fam.add_sample(sample_name, dict(labels), value)
    out.register(_Merged([procs, *families.values()]))  # type: ignore[arg-type]
    return generate_latest(out)


class _Merged:
    """A collector of families already summed (what ``merge_expositions`` registers)."""

    def __init__(self, families: list[Metric]) -> None:
        self.families = families

    def collect(self) -> Iterator[Metric]:
        return iter(self.families)
