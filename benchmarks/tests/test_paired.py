"""The paired A/B's arithmetic on given numbers (``benchmarks/paired.py``): how many pairs
the flags give, the alternating order, and the median and quartiles of per-pair ratios as
``Grid`` computes them from slices filed by pair. No servers, no timing."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest

from benchmarks.context import DURATION_S, QUICK_DURATION_S, QUICK_ROUNDS, ROUNDS, Settings
from benchmarks.machine import Pinning
from benchmarks.paired import (
    PAIRS_PER_ROUND,
    QUICK_PAIRS_PER_ROUND,
    TOGETHER_PAIRS_PER_ROUND,
    PairSpread,
    pair_count,
    pair_order,
    run_pairs,
)
from benchmarks.runner import Grid, RunResult
from benchmarks.scenarios import cases_for
from benchmarks.servers import Server
from benchmarks.stats import median_interval, quartiles


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


def test_the_defaults_give_sixty_pairs_and_a_handful_in_quick_mode() -> None:
    assert pair_count(_settings(ROUNDS, DURATION_S), quick=False) == 3 * PAIRS_PER_ROUND == 60
    assert pair_count(_settings(QUICK_ROUNDS, QUICK_DURATION_S), quick=True) == 4
    assert QUICK_PAIRS_PER_ROUND == 4


def test_rounds_scale_the_pairs_and_duration_does_not() -> None:
    assert pair_count(_settings(5, 5), quick=False) == 100
    assert pair_count(_settings(3, 10), quick=False) == 60
    assert pair_count(_settings(3, 10), quick=True) == 12


def test_pairs_run_together_are_fewer_and_quick_mode_is_the_same_handful() -> None:
    # Together, a pair is --duration long (5 s by default), so a round holds fewer pairs.
    assert pair_count(_settings(ROUNDS, DURATION_S), quick=False, together=True) == 24
    assert TOGETHER_PAIRS_PER_ROUND < PAIRS_PER_ROUND
    assert pair_count(_settings(QUICK_ROUNDS, QUICK_DURATION_S), quick=True, together=True) == 4


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
    # Five pairs are too few to narrow the median: its interval is all of them.
    assert (spread.low, spread.high) == pytest.approx((0.95, 0.98))
    assert spread.pairs == 5
    assert spread.text(100, "{:.1f}%") == (
        "95% CI 95.0% to 98.0%; middle half 97.0% to 98.0%, 5 pairs"
    )


def test_the_median_interval_takes_the_order_statistics_around_the_middle() -> None:
    # 60 values 1..60: ranks 30 -/+ 1.96 x sqrt(60) / 2 = 7.6, so the 22nd and the 39th.
    assert median_interval([float(v) for v in range(60, 0, -1)]) == (22.0, 39.0)
    # 100 values: ranks 50 -/+ 9.8, so the 40th and the 61st.
    assert median_interval([float(v) for v in range(1, 101)]) == (40.0, 61.0)
    assert median_interval([2.0, math.nan]) == (2.0, 2.0)
    low, high = median_interval([])
    assert math.isnan(low) and math.isnan(high)


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


def test_a_server_that_fails_to_start_fails_every_case_without_a_second_start(
    tmp_path: Path,
) -> None:
    starts = tmp_path / "starts"

    def exits(port: int, up: int | None, work: Path) -> list[str]:
        # Counts its own starts, then exits before it ever answers /health.
        code = f"open({str(starts)!r}, 'a').write('x'); raise SystemExit(3)"
        return [sys.executable, "-c", code]

    first, second = Server("first", "first", exits), Server("second", "second", exits)
    settings = Settings(1, 1, 0, tmp_path, Pinning(None, None))
    cases = cases_for(["W1"], quick=True)[:2]
    grid = run_pairs(first, second, cases, settings, pairs=2)
    assert starts.read_text() == "x"  # one start: the first server's, for the first case
    for case in cases:
        (mine,) = grid.runs[(case.key, "first")]
        (other,) = grid.runs[(case.key, "second")]
        assert not mine.ok and mine.error.startswith("start failed: first exited with 3")
        assert not other.ok and other.error == "not run: the other server failed"
