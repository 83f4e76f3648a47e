"""Paired fine-grained interleaving: an A/B of two servers meant to differ by a few percent.

``run_grid`` starts every server fresh per round and compares two runs of several seconds
taken one after the other; on a noisy two-CPU machine the ratio of such a pair swings by
±10 %, so a 3 % target cannot be judged from a handful of rounds. :func:`run_pairs`
instead starts both servers side by side (both pinned to the server CPU: the one not
under load idles and costs nothing), afresh every few pairs, checks one request on each and warms
each up, then runs many pairs of short wrk slices back to back, the order alternating by
pair (A B, B A, ...): background load that drifts over seconds hits both halves of a pair alike, and
a side that gains from going first or second does so in half the pairs only. One pair
still scatters about as much as one round did (much of the machine's noise is faster
than a second), but no start-up is paid per sample, so tens of pairs fit in the time of
a few rounds, and their median narrows as one over the square root of their count.
Starting both servers afresh every few pairs samples what lasts for a process's life (its
memory layout, its hash seed), which pairs within one start cannot average out.

``together=True`` runs the two slices of a pair at the same time instead: each server
gets half the case's connections from a wrk of its own (both wrk on the load CPU), and
the two servers share the server CPU for the same seconds. The scheduler splits that CPU
evenly between two busy processes, so each one's throughput is what its CPU per request
allows, and whatever the machine does in those seconds falls on both at once: measured
on the 2-CPU VM this was written on, a pair's ratio then scatters by about 2 % (an A/A
of identical servers, W1 64 KiB) where alternating slices scatter by about 10 %. Its
ratio answers "how much more does one request cost", which for a server saturating its
CPU is how much lower its requests per second are; it says nothing about latency under
a load one server alone would see.

Each slice is one :class:`~benchmarks.runner.RunResult` whose ``round`` is its pair, so
:meth:`Grid.ratio <benchmarks.runner.Grid.ratio>` is the median of the per-pair ratios
and :meth:`Grid.ratios <benchmarks.runner.Grid.ratios>` the ratios whose spread a report
prints beside it (:func:`pair_spread`: the median's 95 % interval and the middle half of
the pairs), so a reader sees the noise and whether the median can be judged.
"""

from __future__ import annotations

import contextlib
import math
import subprocess
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from . import wrk
from .context import Settings
from .procs import ServerFailed, ServerProcess
from .runner import Grid, RunResult, check_request, prepare, record
from .scenarios import Case
from .servers import Server, started
from .stats import median, median_interval, quartiles

# Seconds of load per slice: wrk's -d takes whole seconds, and the shortest slice gives
# the most pairs in a given time (the noise a pair cancels is the drift between its halves).
SLICE_S = 1
# Pairs per case for each of --rounds: 60 at the default 3. Measured on the 2-CPU VM this
# was written on (an A/A of two identical servers, 60 pairs of W1 64 KiB x32), one pair's
# ratio scatters by about 10 % (middle half 0.96 to 1.08) even on a quiet machine, so the
# median of n pairs is within about 1.25 x 10 % / sqrt(n) of the truth: 1.6 % at 60 pairs,
# enough to tell a 3 % loss at two standard errors; 20 pairs (2.8 %) were not. One pair
# takes about 2 s, so three cases stay under 7 minutes.
PAIRS_PER_ROUND = 20
# Pairs per case for each of --rounds when the two slices run together, each as long as
# --duration (5 s by default: the two wrk start a few milliseconds apart, an edge that
# 5 s makes negligible; measured, a 5 s pair scattered by about 2 %, A/A of W1 64 KiB).
# 8 such pairs cost what 20 alternating pairs of two 1 s slices do (with their starts),
# and their median is about twice as narrow.
TOGETHER_PAIRS_PER_ROUND = 8
# --quick: a handful, to show the method runs (numbers as noisy as any quick run's).
QUICK_PAIRS_PER_ROUND = 4
# Pairs per start of the two servers: both are started afresh after this many, so what
# lasts for a process's life (its memory layout, its hash seed) is sampled a dozen times
# in a full run, not frozen into every pair. A start costs about 5 s (two servers, a
# checked request and a warm-up each): 12 of them add a minute to a 60-pair case.
PAIRS_PER_START = 5
# A fresh server's first requests pay one-time costs (imports, caches, the allocator):
# each server gets at least one slice's worth of warm-up load before the first pair.
MIN_WARMUP_S = SLICE_S

T = TypeVar("T")


def pair_count(settings: Settings, quick: bool, together: bool = False) -> int:
    """Pairs per case: :data:`PAIRS_PER_ROUND` (:data:`TOGETHER_PAIRS_PER_ROUND` when the
    two slices run together) for each of ``--rounds``, :data:`QUICK_PAIRS_PER_ROUND` with
    ``--quick``. Alternating slices are :data:`SLICE_S` whatever ``--duration`` says;
    slices run together last ``--duration``."""
    if quick:
        return settings.rounds * QUICK_PAIRS_PER_ROUND
    return settings.rounds * (TOGETHER_PAIRS_PER_ROUND if together else PAIRS_PER_ROUND)


def pair_order(pair: int, a: T, b: T) -> tuple[T, T]:
    """Which runs first in pair ``pair``: ``a`` in even pairs, ``b`` in odd ones."""
    return (a, b) if pair % 2 == 0 else (b, a)


@dataclass(frozen=True)
class PairSpread:
    """The per-pair ratios of one case: their median with its 95 % interval, their
    quartiles (the middle half: the noise one pair carries), and their count."""

    median: float
    low: float  # the median's 95 % interval (``stats.median_interval``)
    high: float
    q1: float
    q3: float
    pairs: int

    @classmethod
    def of(cls, ratios: Sequence[float]) -> PairSpread:
        kept = [r for r in ratios if not math.isnan(r)]
        low, high = median_interval(kept)
        q1, q3 = quartiles(kept)
        return cls(median(kept), low, high, q1, q3, len(kept))

    def text(self, scale: float = 1.0, fmt: str = "{:.3f}") -> str:
        """``"95% CI L to H; middle half Q1 to Q3, N pairs"``, each bound times ``scale``
        (100 for percent) in ``fmt``."""
        if not self.pairs:
            return "no pairs"

        def two(a: float, b: float) -> str:
            return f"{fmt.format(a * scale)} to {fmt.format(b * scale)}"

        return (
            f"95% CI {two(self.low, self.high)}; "
            f"middle half {two(self.q1, self.q3)}, {self.pairs} pairs"
        )


def pair_spread(
    grid: Grid, case: str, a: str, b: str, get: Callable[[RunResult], float]
) -> PairSpread:
    """The median of a/b over the pairs of ``case``, its 95 % interval and quartiles."""
    return PairSpread.of(grid.ratios(case, a, b, get))


def run_pairs(
    a: Server,
    b: Server,
    cases: Sequence[Case],
    settings: Settings,
    pairs: int,
    case_for: Callable[[Server, Case], Case] | None = None,
    together: bool = False,
) -> Grid:
    """Per case, ``pairs`` pairs of :data:`SLICE_S` wrk slices on ``a`` and ``b``, both
    started afresh (checked and warmed up) every :data:`PAIRS_PER_START` pairs: a
    difference that lasts for a process's life (its memory layout, its hash seed) is then
    sampled many times instead of frozen into every pair. ``case_for`` picks
    the request a server gets (its script is written under that case's key, so give the
    two distinct keys); every slice is filed under the case. A server whose start failed
    once is not started again. ``together``: each pair's two slices run at the same time,
    ``settings.duration_s`` long, each server getting half the case's connections."""
    grid = Grid()
    for srv in (a, b):
        why = srv.missing()
        if why:
            grid.skipped[srv.name] = why
    if grid.skipped:
        return grid
    broken: dict[str, str] = {}
    starts = max(1, math.ceil(pairs / PAIRS_PER_START))
    for case in cases:
        sent = {srv.name: case_for(srv, case) if case_for else case for srv in (a, b)}
        first = 0
        for start in range(starts):
            if broken:
                break
            count = (pairs - first) // (starts - start)  # the pairs spread evenly
            with contextlib.ExitStack() as stack:
                # Which server starts (and warms up) first alternates by start, as the
                # slices' order does by pair, so an advantage of either place falls on
                # both alike. (Together-run A/As of W1 64 KiB read 1.01x with the same
                # server always first, then 1.00x and 1.01x alternating: no place bias
                # beyond their 95 % intervals, about ±1.3 %.)
                order = pair_order(start, a, b)
                running = _start_both(stack, order, settings, broken)
                if running is not None:
                    _pairs(
                        grid,
                        (a, b),
                        running,
                        case,
                        sent,
                        settings,
                        (first, count, pairs),
                        order,
                        together,
                    )
            first += count
        if not broken:
            continue
        for srv in (a, b):
            why = broken.get(srv.name, "not run: the other server failed")
            grid.add(_failed(srv, case, why))
            print(f"  {case.key} {srv.name}: {why[:300]}", flush=True)
    return grid


def _start_both(
    stack: contextlib.ExitStack[bool | None],
    servers: tuple[Server, Server],
    settings: Settings,
    broken: dict[str, str],
) -> dict[str, ServerProcess] | None:
    """Both servers started (stopped when ``stack`` closes), or None with the reason in
    ``broken``."""
    running: dict[str, ServerProcess] = {}
    for srv in servers:
        try:
            running[srv.name] = stack.enter_context(
                started(srv, settings.pins, settings.results_dir)
            )
        except ServerFailed as exc:
            broken[srv.name] = f"start failed: {exc}"
            return None
    return running


def _failed(srv: Server, case: Case, error: str) -> RunResult:
    return RunResult(server=srv.name, case=case.key, round=0, ok=False, error=error)


def _pairs(
    grid: Grid,
    servers: tuple[Server, Server],
    running: dict[str, ServerProcess],
    case: Case,
    sent: dict[str, Case],
    settings: Settings,
    span: tuple[int, int, int],
    order: tuple[Server, Server],
    together: bool = False,
) -> None:
    """Check, warm up (in ``order``), then pairs ``first`` to ``first + count`` (of
    ``pairs``: ``span``) of one case on two running servers."""
    first, count, pairs = span
    scripts: dict[str, Path] = {}
    try:
        for srv in servers:
            server, own = running[srv.name], sent[srv.name]
            problem = check_request(server.port, own, srv.tls)
            if problem is not None:
                grid.add(_failed(srv, case, f"unsupported: {problem}"))
                return
            scripts[srv.name] = prepare(own, settings)[1]
        for srv in order:
            wrk.run(
                scripts[srv.name],
                running[srv.name].port,
                case.path,
                case.connections,
                max(settings.warmup_s, MIN_WARMUP_S),
                settings.pins.load_cpu,
                srv.tls,
            )
    except (OSError, RuntimeError, subprocess.SubprocessError) as exc:
        for srv in servers:
            grid.add(_failed(srv, case, f"{type(exc).__name__}: {exc}"))
        return
    for pair in range(first, first + count):
        got = {}
        if together:
            got = _together(servers, running, sent, scripts, settings, pair)
        else:
            for srv in pair_order(pair, *servers):
                got[srv.name] = _slice(
                    srv, running[srv.name], sent[srv.name], scripts[srv.name], settings, pair
                )
        for r in got.values():
            r.case = case.key
            grid.add(r)
        a, b = (got[s.name] for s in servers)
        rate = "events_per_s" if case.kind == "stream" else "rps"
        ratio = getattr(b, rate) / getattr(a, rate) if a.ok and b.ok else math.nan
        print(
            f"  [pair {pair + 1}/{pairs}] {case.key}: {a.server} {getattr(a, rate):,.0f}, "
            f"{b.server} {getattr(b, rate):,.0f}, {b.server}/{a.server} {ratio:.3f}"
            + (f" ({a.error or b.error})" if not (a.ok and b.ok) else ""),
            flush=True,
        )
        if not all(running[s.name].alive() for s in servers):
            return  # the died server's slice says so; the rest of the case is lost


def _together(
    servers: tuple[Server, Server],
    running: dict[str, ServerProcess],
    sent: dict[str, Case],
    scripts: dict[str, Path],
    settings: Settings,
    pair: int,
) -> dict[str, RunResult]:
    """One pair whose two slices run at the same time, each server under half the case's
    connections, each slice measured as ``_slice`` measures one alone."""
    got: dict[str, RunResult] = {}
    with ThreadPoolExecutor(max_workers=2) as pool:  # each thread waits on its own wrk
        futures = {
            srv.name: pool.submit(
                _slice,
                srv,
                running[srv.name],
                sent[srv.name],
                scripts[srv.name],
                settings,
                pair,
                max(1, settings.duration_s),
                max(1, sent[srv.name].connections // 2),
            )
            for srv in pair_order(pair, *servers)
        }
        for name, future in futures.items():
            got[name] = future.result()
    return got


def _slice(
    srv: Server,
    server: ServerProcess,
    case: Case,
    script: Path,
    settings: Settings,
    pair: int,
    seconds: int = SLICE_S,
    connections: int | None = None,
) -> RunResult:
    """One wrk slice under CPU accounting of the server's process tree."""
    result = RunResult(server=srv.name, case=case.key, round=pair, ok=False)
    try:
        u0 = server.usage()
        res = wrk.run(
            script,
            server.port,
            case.path,
            connections or case.connections,
            seconds,
            settings.pins.load_cpu,
            srv.tls,
        )
        u1 = server.usage()
    except (OSError, RuntimeError, subprocess.SubprocessError) as exc:
        result.error = f"{type(exc).__name__}: {exc}"
        return result
    record(result, res, case, u1.cpu_s - u0.cpu_s)
    if not server.alive():
        result.error = f"server died: {server.log_tail()}"
        return result
    result.ok = res.good > 0
    if not result.ok:
        result.error = "no request completed with a 2xx status"
    return result
