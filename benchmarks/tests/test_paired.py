"""The paired A/B's arithmetic on given numbers (``benchmarks/paired.py``): how many pairs
the flags give, the alternating order, and the median and quartiles of per-pair ratios as
``Grid`` computes them from slices filed by pair. No servers, no timing."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from benchmarks.context import DURATION_S, QUICK_DURATION_S, QUICK_ROUNDS, ROUNDS, Settings
from benchmarks.machine import Pinning
from benchmarks.paired import MIN_PAIRS, QUICK_MIN_PAIRS, PairSpread, pair_count, pair_order
from benchmarks.runner import Grid, RunResult
from benchmarks.stats import quartiles


def _settings(rounds: int, duration_s: int) -> Settings:
    return Settings(rounds, duration_s, 0, Path("/nonexistent"), Pinning(None, None))


def _grid(plain: list[float], keyed: list[float]) -> Grid:
    """Slices of one case: pair i has ``plain[i]`` and ``keyed[i]`` req/s."""
    grid = Grid()
    for pair, (p, k) in enumerate(zip(plain, keyed, strict=True)):
        for name, rate in (("plain", p), ("keyed", k)):
            grid.add(RunResult(server=name, case="c", round=pair, ok=True, rps=rate))
    return grid


def _rps(r: RunResult) -> float:
    return r.rps


def test_the_defaults_give_twenty_pairs_and_a_handful_in_quick_mode() -> None:
    assert pair_count(_settings(ROUNDS, DURATION_S), quick=False) == MIN_PAIRS == 20
    assert pair_count(_settings(QUICK_ROUNDS, QUICK_DURATION_S), quick=True) == QUICK_MIN_PAIRS


def test_more_rounds_or_longer_runs_give_more_pairs() -> None:
    # --rounds 10 --duration 5: the 50 load-seconds per server that fresh rounds would take.
    assert pair_count(_settings(10, 5), quick=False) == 50
    assert pair_count(_settings(3, 10), quick=False) == 30
    assert pair_count(_settings(3, 10), quick=True) == 30


def test_the_order_alternates_by_pair() -> None:
    assert [pair_order(i, "A", "B") for i in range(4)] == [
        ("A", "B"),
        ("B", "A"),
        ("A", "B"),
        ("B", "A"),
    ]


def test_the_ratio_is_the_median_of_per_pair_ratios() -> None:
    plain = [100.0, 200.0, 50.0, 100.0, 90.0]
    keyed = [97.0, 190.0, 49.0, 98.0, 87.3]
    grid = _grid(plain, keyed)
    assert grid.ratios("c", "keyed", "plain", _rps) == pytest.approx([0.97, 0.95, 0.98, 0.98, 0.97])
    assert grid.ratio("c", "keyed", "plain", _rps) == pytest.approx(0.97)


def test_the_spread_is_the_quartiles_of_the_pair_ratios() -> None:
    spread = PairSpread.of([0.97, 0.95, 0.98, 0.98, 0.97])
    assert spread.median == pytest.approx(0.97)
    assert (spread.q1, spread.q3) == pytest.approx((0.97, 0.98))
    assert spread.pairs == 5
    assert spread.text(100, "{:.1f}%") == "middle half 97.0% to 98.0%, 5 pairs"


def test_a_pair_with_a_failed_slice_is_left_out() -> None:
    grid = _grid([100.0, 100.0, 100.0], [99.0, 98.0, 97.0])
    grid.runs[("c", "plain")][1].ok = False  # pair 1's no-key slice failed
    assert grid.ratios("c", "keyed", "plain", _rps) == pytest.approx([0.99, 0.97])
    assert PairSpread.of(grid.ratios("c", "keyed", "plain", _rps)).pairs == 2


def test_quartiles_interpolate_and_skip_nan() -> None:
    assert quartiles([4.0, 1.0, math.nan, 3.0, 2.0]) == pytest.approx((1.75, 3.25))
    q1, q3 = quartiles([])
    assert math.isnan(q1) and math.isnan(q3)
    spread = PairSpread.of([])
    assert spread.pairs == 0 and math.isnan(spread.median) and spread.text() == "no pairs"
