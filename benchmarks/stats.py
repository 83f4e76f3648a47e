"""The harness's one percentile, median and quartiles: every table of BENCHMARKS.md uses
these.

``percentile`` interpolates linearly between the two nearest ranks (numpy's default,
``method="linear"``), so p50 of an even count is the mean of the middle two. wrk's own
histogram percentiles (``wrk.py``) are wrk's; everything the harness samples itself (first
events, TTFT, probes, rejection latencies) goes through here.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence


def percentile(values: Sequence[float], p: float) -> float:
    """Linear-interpolated percentile (``p`` in 0..100); NaN for no values."""
    if not values:
        return math.nan
    xs = sorted(values)
    k = (len(xs) - 1) * p / 100
    lo, hi = math.floor(k), math.ceil(k)
    return xs[lo] + (xs[hi] - xs[lo]) * (k - lo)


def median(values: Iterable[float]) -> float:
    """The median of the non-NaN values; NaN when none are left."""
    return percentile([v for v in values if not math.isnan(v)], 50)


def quartiles(values: Iterable[float]) -> tuple[float, float]:
    """The first and third quartiles (p25, p75) of the non-NaN values: the middle half of
    a set of ratios, which a report shows beside their median. NaN, NaN when none."""
    kept = [v for v in values if not math.isnan(v)]
    return percentile(kept, 25), percentile(kept, 75)
