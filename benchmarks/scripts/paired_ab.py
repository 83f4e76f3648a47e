"""This tree against another, by paired slices (``benchmarks/paired.py``): what a change
does to W1/W2/W3 cases, finer than the suites' three rounds can resolve.

Run: ``ZSBENCH_BASELINE_SRC=/tmp/base/src .venv/bin/python -m benchmarks.scripts.paired_ab
[--cases W3-chat-64KB,W1-64KiB] [--pairs 30]`` from the repository root, with the other
tree checked out and (for a compiled baseline) built there (``git worktree add /tmp/base
REV``, then ``.venv/bin/python tools/build_compiled.py`` in it). Both zeroserves serve the
benchmark's echo model side by side on the server CPU, restarted every few pairs; each
pair is two 1 s wrk slices in alternating order, or with ``--together`` both servers
loaded at the same time. Printed per case: this tree's
requests/s (tokens/s for streams) and CPU per request over the baseline's, the median
of the pairs with its 95 % interval and the middle half of the pairs.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path

from ..context import Settings
from ..machine import Pinning, harness_on_load_cpu
from ..paired import pair_spread, run_pairs
from ..report import cpu, eps, rps
from ..scenarios import cases_for
from ..servers import BASELINE_SRC_ENV, ECHO, at_baseline, zeroserve
from ..suites.w3 import w3_case

RESULTS = Path("bench-results/paired_ab")
DEFAULT_CASES = "W3-chat-64KB,W1-64KiB"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--cases", default=DEFAULT_CASES, help="comma-separated W1/W2/W3 case keys")
    p.add_argument("--pairs", type=int, default=30, help="pairs per case")
    p.add_argument(
        "--together",
        action="store_true",
        help="load both servers at the same time in each pair, half the connections each, "
        "for --seconds (benchmarks/paired.py): a CPU-per-request comparison about five "
        "times less noisy than alternating 1 s slices",
    )
    p.add_argument("--seconds", type=int, default=5, help="a pair's length with --together")
    args = p.parse_args()
    subject = zeroserve(extra=("--model", ECHO))
    base = at_baseline(subject, "zeroserve-base", "zeroserve@base")
    if base is None:
        p.error(f"set {BASELINE_SRC_ENV} to the other tree's src/")
    known = {c.key: c for c in [*cases_for(["W1", "W2"], quick=False), w3_case()]}
    wanted = args.cases.split(",")
    unknown = [k for k in wanted if k not in known]
    if unknown:
        p.error(f"unknown cases {unknown}; known: {', '.join(known)}")
    # No first-event probe or strace: the comparison is throughput.
    cases = [
        dataclasses.replace(known[k], probe_first_event=False, count_writes=False) for k in wanted
    ]
    settings = Settings(
        rounds=1,
        duration_s=args.seconds,
        warmup_s=1,
        results_dir=RESULTS.resolve(),
        pins=Pinning.detect(),
    )
    settings.results_dir.mkdir(parents=True, exist_ok=True)
    with harness_on_load_cpu(settings.pins):
        grid = run_pairs(subject, base, cases, settings, args.pairs, together=args.together)
    if grid.skipped:
        print(f"not run: {grid.skipped}")
        return 1
    print("| case | this tree / baseline | CPU per request, this / baseline |")
    print("|---|---|---|")
    for c in cases:
        rate = eps if c.events_per_request else rps
        through = pair_spread(grid, c.key, subject.name, base.name, rate)
        cost = pair_spread(grid, c.key, subject.name, base.name, cpu)
        print(
            f"| {c.label} | {through.median:.3f}x ({through.text()}) "
            f"| {cost.median:.3f}x ({cost.text()}) |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
