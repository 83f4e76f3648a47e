"""The harness's one percentile, median, quartiles and median interval: every table of
BENCHMARKS.md uses these.

``percentile`` interpolates linearly between the two nearest ranks (numpy's default,
``method="linear"``), so p50 of an even count is the mean of the middle two. wrk's own
histogram percentiles (``wrk.py``) are wrk's; everything the harness samples itself (first
events, TTFT, probes, rejection latencies) goes through here.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

# z of a two-sided 95 % interval (normal approximation).
Z95 = 1.96


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


def median_interval(values: Iterable[float], z: float = Z95) -> tuple[float, float]:
    """A distribution-free confidence interval for the median of the non-NaN values: the
    order statistics of ranks n/2 - z·√n/2 and 1 + n/2 + z·√n/2 (the binomial count of
    values below the median, approximated as normal), clamped to the smallest and largest.
    With 60 values, the 22nd and 39th smallest; below about 6 values, all of them. NaN,
    NaN when none."""
    xs = sorted(v for v in values if not math.isnan(v))
    if not xs:
        return math.nan, math.nan
    n, half = len(xs), z * math.sqrt(len(xs)) / 2
    lo = max(0, math.floor(n / 2 - half) - 1)  # 0-based index of the lower rank
    hi = min(n - 1, math.ceil(n / 2 + half))  # 0-based index of the upper rank
    return xs[lo], xs[hi]
