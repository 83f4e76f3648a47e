"""The report: table helpers, targets, and the one merger that writes BENCHMARKS.md.

Every suite returns a :class:`Section`: its ``group`` and its own part (Markdown starting
with a ``###`` heading). :func:`merge` writes a group's parts between
``<!-- zeroserve-bench:GROUP begin -->`` and ``<!-- zeroserve-bench:GROUP end -->``, each
part inside its own inner markers (``GROUP/SUITE``), so rerunning some suites replaces
their parts and keeps the others, and everything outside the markers is hand-written text
that is kept as it is.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from .context import Settings, SuiteContext
from .machine import is_realtime, load_average, steal_line
from .runner import Grid, RunResult
from .scenarios import Case
from .servers import Server
from .stats import median, median_interval

# A target counts as met only if at most this share of the subject's requests failed.
MAX_ERROR_SHARE = 0.01
_PREFIX = "<!-- zeroserve-bench:"
# The hand-written part that follows every group's block (what the tables fall short of).
SHORTFALLS = "## Where zeroserve falls short"


@dataclass(frozen=True)
class Section:
    group: str  # marker name, e.g. "W5-W8"
    title: str  # the group's heading, used when the group is new in the file
    markdown: str  # this suite's part (starts with its own ### heading)


def _marks(name: str) -> tuple[str, str]:
    return f"{_PREFIX}{name} begin -->", f"{_PREFIX}{name} end -->"


def _between(text: str, name: str) -> tuple[int, int, str] | None:
    """(start, end, inner text) of the block ``name`` in ``text``, or None."""
    begin, end = _marks(name)
    i = text.find(begin)
    j = text.find(end, i + len(begin)) if i >= 0 else -1
    if i < 0 or j < 0:
        return None
    return i, j + len(end), text[i + len(begin) : j]


def merge(existing: str, sections: dict[str, Section]) -> str:
    """Write each suite's part into its group's block of ``existing``; keep the rest."""
    out = existing
    for group in dict.fromkeys(s.group for s in sections.values()):
        mine = {sid: s for sid, s in sections.items() if s.group == group}
        found = _between(out, group)
        inner = found[2] if found else ""
        # Parts already in the block, in their order; rerun suites replace theirs.
        parts: dict[str, str] = {}
        pos = 0
        while (k := inner.find(_PREFIX + group + "/", pos)) >= 0:
            sid = inner[k:].split("/", 1)[1].split(" ", 1)[0]
            block = _between(inner[k:], f"{group}/{sid}")
            if block is None:
                break
            parts[sid] = block[2].strip("\n")
            pos = k + block[1]
        for sid, sec in mine.items():
            parts[sid] = sec.markdown.strip("\n")
        title = next(iter(mine.values())).title
        head = inner.split(_PREFIX + group + "/", 1)[0].strip("\n") if found else title
        body = [head, ""]
        for sid, part in parts.items():
            b, e = _marks(f"{group}/{sid}")
            body += [b, part, e, ""]
        begin, end = _marks(group)
        text = "\n".join([begin, *body, end])
        at = out.find(SHORTFALLS)
        if found:
            out = out[: found[0]] + text + out[found[1] :]
        elif at >= 0:  # a new group goes with the others, before the hand-written end
            out = out[:at] + text + "\n\n" + out[at:]
        else:
            out = out.rstrip("\n") + ("\n\n" if out.strip() else "") + text + "\n"
    return out


# -- cells ----------------------------------------------------------------------------------


def num(x: float | None, digits: int = 3) -> str:
    """A number for a table: 3 significant digits, thousands separated, '-' for none."""
    if x is None or math.isnan(x):
        return "-"
    if math.isinf(x):
        return "never"
    if abs(x) >= 1000:
        return f"{x:,.0f}"
    if abs(x) >= 100:
        return f"{x:.0f}"
    return f"{x:.{digits}g}"


def fixed(x: float | None, nd: int = 1) -> str:
    """A number with ``nd`` decimals, '-' for none."""
    return "-" if x is None or math.isnan(x) else f"{x:,.{nd}f}"


def times(v: float) -> str:
    return "-" if math.isnan(v) else f"{v:.2f}x"


def mark(ok: bool | None) -> str:
    return "n/a" if ok is None else ("met" if ok else "**missed**")


# The verdict of a goal the point estimate misses while its 95 % interval reaches it: the
# run cannot tell the two apart, so it says so instead of "missed".
WITHIN_NOISE = "level, within noise"


def rps(r: RunResult) -> float:
    return r.rps


def eps(r: RunResult) -> float:
    return r.events_per_s


def cpu(r: RunResult) -> float:
    return r.cpu_ms_per_request


def peak_rss(r: RunResult) -> float:
    return r.peak_rss_mib


def p(pct: float) -> Callable[[RunResult], float]:
    return lambda r: r.latency_pct_ms.get(pct, math.nan)


@dataclass(frozen=True)
class Target:
    """A goal judged from this run's numbers. ``error_share`` above MAX_ERROR_SHARE (the
    subject's failed requests in the measurement behind ``value``) fails it."""

    name: str
    goal: str
    value: float
    fmt: str
    met: Callable[[float], bool]
    note: str = ""
    error_share: float = 0.0
    interval: tuple[float, float] | None = None  # the value's 95 % interval, if known

    def row(self) -> str:
        if math.isnan(self.value):
            return f"| {self.name} | {self.goal} | - {self.note} | n/a |"
        measured = self.fmt.format(self.value) + (f" {self.note}" if self.note else "")
        if self.error_share > MAX_ERROR_SHARE:
            return (
                f"| {self.name} | {self.goal} | {measured} with "
                f"{100 * self.error_share:.1f}% failed requests | **missed** |"
            )
        return f"| {self.name} | {self.goal} | {measured} | {self.verdict()} |"

    def verdict(self) -> str:
        if self.met(self.value):
            return "met"
        low, high = self.interval or (math.nan, math.nan)
        if not math.isnan(low) and (self.met(low) or self.met(high)):
            return WITHIN_NOISE
        return "**missed**"


def round_ratios(
    name: str, goal: str, ratios: Sequence[float], met: Callable[[float], bool]
) -> Target:
    """A goal on per-round ratios (each round's subject / its peer in the same round): the
    median, judged with its 95 % interval (``stats.median_interval``)."""
    low, high = median_interval(ratios)
    note = f"(95 % interval {low:.2f}x-{high:.2f}x, {len(ratios)} rounds)"
    value = median(ratios) if ratios else math.nan
    return Target(name, goal, value, "{:.2f}x", met, note=note, interval=(low, high))


def targets(rows: Sequence[Target]) -> list[str]:
    if not rows:
        return []
    return ["", "| target | goal | measured | |", "|---|---|---|---|", *[t.row() for t in rows]]


def skipped(grid: Grid) -> list[str]:
    if not grid.skipped:
        return []
    return ["", "Not run:", *[f"- {k}: {v}" for k, v in grid.skipped.items()]]


def footer(
    ctx: SuiteContext, settings: Settings | None = None, notes: Sequence[str] = ()
) -> list[str]:
    """Notes, the machine facts, the pinning, and how to reproduce: the last lines of
    every part."""
    lines = ["", *[f"- {n}" for n in notes], *[f"- {m}" for m in ctx.machine]]
    if settings is not None:
        lines.append(
            f"- {settings.rounds} round(s) x {settings.duration_s} s per measurement"
            f" (+{settings.warmup_s} s warm-up)"
        )
    # The run's start is in ctx.machine; a part that ran later (or while load rose) says
    # its own end.
    lines.append(f"- Load average when this part ended: {load_average()}")
    pins = ctx.pins
    cpus = [c for c in (pins.server_cpu, pins.load_cpu) if c is not None] or None
    stolen = steal_line(ctx.cpu_at_start, cpus)
    if stolen:
        lines.append(f"- {stolen}")
    if not ctx.pins.pinned:
        lines.append("- Fewer than 2 CPUs: server and clients were NOT pinned apart.")
    lines.append(
        f"- Reproduce: `{ctx.command}`" + (" (quick mode: short, noisy)" if ctx.quick else "")
    )
    return lines


def probe_note(what: str, priority: str) -> str:
    """The one sentence every section with a probe's latency percentiles gives: at which
    priority ``what`` (the probe, named as the section names it) ran, and why.

    Args:
        what: the probe as the section calls it ("probe", "first-event probe").
        priority: ``machine.probe_priority``'s words, as the probe process reported them.
    """
    if is_realtime(priority):
        return (
            f"The {what} ran at {priority} on the load CPU, so its wake-ups do not wait for "
            "the load generator's time slice there and its percentiles are the server's; "
            "it is the same for every server."
        )
    return (
        f"The {what} ran at {priority}: on the load CPU its wake-ups can wait for the load "
        "generator's time slice, which adds to every server's percentiles alike."
    )


def first_event_note(grid: Grid) -> str:
    """:func:`probe_note` for the first-event probe of ``grid``'s runs ("" when no run
    probed)."""
    return " ".join(probe_note("first-event probe", words) for words in grid.probe_priorities())


def error_text(grid: Grid, case: str, server: str) -> str:
    runs = grid.ok(case, server)
    errors = sum(r.wrk_errors for r in runs)
    probes = sum(r.probe_failures for r in runs)
    text = "0" if not errors else f"**{errors} ({100 * grid.error_share(case, server):.1f}%)**"
    return text + (f" + {probes} probe" if probes else "")


def wrk_table(
    grid: Grid,
    cases: Sequence[Case],
    servers: Sequence[Server],
    base: str,
    stream: bool = False,
    copies: bool = True,
) -> list[str]:
    """The compact wrk table of the API suites: throughput, latency, CPU, RSS, copies."""
    unit = "tokens/s" if stream else "req/s"
    lines = [
        f"| case | server | {unit} | vs {base} | p50 ms | p99 ms | CPU ms / req "
        "| peak RSS MiB | copied % of in | errors |",
        "|---|---|--:|--:|--:|--:|--:|--:|--:|--:|",
    ]
    get = eps if stream else rps
    for case in cases:
        for srv in servers:
            if srv.name in grid.skipped or not grid.has(case.key, srv.name):
                continue
            if not grid.ok(case.key, srv.name):
                lines.append(
                    f"| {case.label} | {srv.title} | {grid.why(case.key, srv.name)} | | | | | | | |"
                )
                continue
            share = grid.error_share(case.key, srv.name)
            lines.append(
                f"| {case.label} | {srv.title} | {num(grid.med(case.key, srv.name, get))} "
                f"| {times(grid.ratio(case.key, srv.name, base, get))} "
                f"| {num(grid.med(case.key, srv.name, p(50)))} "
                f"| {num(grid.med(case.key, srv.name, p(99)))} "
                f"| {num(grid.med(case.key, srv.name, cpu))} "
                f"| {num(grid.med(case.key, srv.name, peak_rss))} "
                f"| {num(grid.copied_pct(case.key, srv.name), 2) if copies else '-'} "
                f"| {'0' if not share else f'{100 * share:.1f}%'} |"
            )
    return lines
