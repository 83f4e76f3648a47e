"""The load generator's report: percentiles, the table, the JSON document, the plot.

Percentiles interpolate linearly between the nearest ranks (numpy's default). Latency
is from sending the request to the end of its answer; TTFT from sending to the first
token's arrival; inter-token latency the gaps between a request's successive tokens (a
piece of the body that carries several tokens gives gaps of 0, as it arrived at once).
Rates are over the run's wall time. Only successful requests enter the latency figures.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .run import Run

PERCENTILES = (50.0, 90.0, 99.0)


def percentile(values: Sequence[float], p: float) -> float:
    """Linear-interpolated percentile (``p`` in 0..100); NaN for no values."""
    if not values:
        return math.nan
    xs = sorted(values)
    k = (len(xs) - 1) * p / 100
    lo, hi = math.floor(k), math.ceil(k)
    return xs[lo] + (xs[hi] - xs[lo]) * (k - lo)


@dataclass(frozen=True)
class Dist:
    """A distribution in milliseconds."""

    n: int
    mean: float
    pcts: dict[float, float]
    max: float

    @classmethod
    def of(cls, seconds: Sequence[float]) -> Dist:
        ms = [s * 1000 for s in seconds]
        return cls(
            len(ms),
            sum(ms) / len(ms) if ms else math.nan,
            {p: percentile(ms, p) for p in PERCENTILES},
            max(ms) if ms else math.nan,
        )

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"n": self.n, "mean": _num(self.mean)}
        out.update({f"p{p:g}": _num(v) for p, v in self.pcts.items()})
        out["max"] = _num(self.max)
        return out


def _num(x: float) -> float | None:
    return None if math.isnan(x) else round(x, 4)


@dataclass(frozen=True)
class Summary:
    requests: int
    ok: int
    errors: dict[str, int]
    duration_s: float
    output_tokens: int
    latency: Dist
    ttft: Dist
    itl: Dist

    @property
    def requests_per_s(self) -> float:
        return self.ok / self.duration_s if self.duration_s > 0 else math.nan

    @property
    def tokens_per_s(self) -> float:
        return self.output_tokens / self.duration_s if self.duration_s > 0 else math.nan


def summarize(run: Run) -> Summary:
    ok = [r for r in run.results if r.ok]
    ttft = [r.token_times[0] - r.start for r in ok if r.token_times]
    itl = [b - a for r in ok for a, b in zip(r.token_times, r.token_times[1:], strict=False)]
    errors = Counter(r.error for r in run.results if not r.ok)
    return Summary(
        requests=len(run.results),
        ok=len(ok),
        errors=dict(sorted(errors.items())),
        duration_s=run.duration_s,
        output_tokens=sum(r.tokens for r in ok),
        latency=Dist.of([r.latency_s for r in ok]),
        ttft=Dist.of(ttft),
        itl=Dist.of(itl),
    )


def _ms(x: float) -> str:
    return "-" if math.isnan(x) else f"{x:,.2f}"


def table(s: Summary, title: str) -> str:
    rate = "-" if math.isnan(s.requests_per_s) else f"{s.requests_per_s:,.1f}"
    tps = "-" if math.isnan(s.tokens_per_s) else f"{s.tokens_per_s:,.1f}"
    lines = [
        title,
        f"requests        {s.requests} sent, {s.ok} ok, {s.requests - s.ok} errors "
        f"in {s.duration_s:.2f} s",
        f"throughput      {rate} req/s, {tps} output tokens/s ({s.output_tokens} tokens)",
        "",
        f"{'ms':<16}{'n':>8}{'mean':>10}"
        + "".join(f"{'p' + format(p, 'g'):>10}" for p in PERCENTILES)
        + f"{'max':>10}",
    ]
    for name, d in (("latency", s.latency), ("TTFT", s.ttft), ("inter-token", s.itl)):
        lines.append(
            f"{name:<16}{d.n:>8}{_ms(d.mean):>10}"
            + "".join(f"{_ms(d.pcts[p]):>10}" for p in PERCENTILES)
            + f"{_ms(d.max):>10}"
        )
    lines.append("")
    if s.errors:
        lines.append("errors          " + ", ".join(f"{k}: {v}" for k, v in s.errors.items()))
    else:
        lines.append("errors          none")
    return "\n".join(lines)


def to_json(s: Summary, meta: dict[str, Any]) -> dict[str, Any]:
    return {
        **meta,
        "requests": {"sent": s.requests, "ok": s.ok, "errors": s.requests - s.ok},
        "errors": s.errors,
        "duration_s": round(s.duration_s, 4),
        "requests_per_s": _num(s.requests_per_s),
        "output_tokens": s.output_tokens,
        "tokens_per_s": _num(s.tokens_per_s),
        "latency_ms": s.latency.to_json(),
        "ttft_ms": s.ttft.to_json(),
        "itl_ms": s.itl.to_json(),
    }


class PlotUnavailable(Exception):
    """matplotlib is not installed."""


def pyplot() -> Any:
    """matplotlib.pyplot on the Agg backend, or PlotUnavailable."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as exc:
        raise PlotUnavailable(
            "--plot needs matplotlib: install the bench extra, "
            "pip install 'zeroserve[bench]' (or pip install matplotlib)"
        ) from exc
    return plt


def plot(run: Run, path: Path, title: str) -> None:
    """Latency over the run, and CDFs of latency, TTFT and inter-token latency."""
    plt = pyplot()
    ok = [r for r in run.results if r.ok]
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    left.scatter([r.start - run.started for r in ok], [r.latency_s * 1000 for r in ok], s=4)
    failed = [r for r in run.results if not r.ok]
    if failed:
        left.scatter(
            [r.start - run.started for r in failed],
            [r.latency_s * 1000 for r in failed],
            s=6,
            c="red",
            label="errors",
        )
        left.legend()
    left.set_xlabel("time since start, s")
    left.set_ylabel("request latency, ms")
    left.set_title("latency over the run")
    series = {
        "latency": [r.latency_s * 1000 for r in ok],
        "TTFT": [(r.token_times[0] - r.start) * 1000 for r in ok if r.token_times],
        "inter-token": [
            (b - a) * 1000
            for r in ok
            for a, b in zip(r.token_times, r.token_times[1:], strict=False)
        ],
    }
    for name, xs in series.items():
        if xs:
            xs = sorted(xs)
            right.plot(xs, [(i + 1) / len(xs) for i in range(len(xs))], label=name)
    right.set_xscale("symlog", linthresh=0.1)
    right.set_xlabel("ms")
    right.set_ylabel("fraction")
    right.set_title("CDF")
    right.grid(True, alpha=0.3)
    right.legend()
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
