"""W1: raw echo of 64 KiB, 1 MiB and 8 MiB bodies at 32 connections (wrk), zeroserve
against FastAPI, granian and aiohttp."""

from __future__ import annotations

import math
from collections.abc import Callable

from ..context import SuiteContext
from ..report import Section, Target, cpu, footer, rps, skipped, targets
from ..servers import BASELINE, SUBJECT
from ._scenario import GROUP, TITLE, copies_by_site, echo_table, peers_behind, run

# W1 8 MiB x 32: peak RSS at most every body in flight once plus a fixed allowance.
W1_8MIB_RSS_CAP_MIB = 32 * 8 + 64


def w1(ctx: SuiteContext) -> Section:
    cases, servers, grid, settings, notes = run(ctx, "W1")
    by_key = {c.key: c for c in cases if grid.ok(c.key, SUBJECT)}
    rows: list[Target] = []

    def judge(
        key: str, name: str, goal: str, value: float, fmt: str, ok: Callable[[float], bool]
    ) -> None:
        rows.append(Target(name, goal, value, fmt, ok, error_share=grid.error_share(key, SUBJECT)))

    if "W1-64KiB" in by_key:
        judge(
            "W1-64KiB",
            "W1 64 KiB req/s",
            "≥3.5x FastAPI",
            grid.ratio("W1-64KiB", SUBJECT, BASELINE, rps),
            "{:.2f}x",
            lambda v: v >= 3.5,
        )
        ahead = peers_behind(grid, by_key["W1-64KiB"], servers)
        rows.append(
            Target(
                "W1 64 KiB vs Python peers",
                "ahead of every Python peer",
                math.nan if ahead is None else float(ahead.startswith("ahead")),
                ahead or "",
                lambda v: v == 1.0,
                note="" if ahead is not None else "no other peer measured",
            )
        )
    if "W1-1MiB" in by_key:
        judge(
            "W1-1MiB",
            "W1 1 MiB req/s",
            "≥1.75x FastAPI",
            grid.ratio("W1-1MiB", SUBJECT, BASELINE, rps),
            "{:.2f}x",
            lambda v: v >= 1.75,
        )
        judge(
            "W1-1MiB",
            "W1 1 MiB CPU per request",
            "≤0.5x FastAPI",
            grid.ratio("W1-1MiB", SUBJECT, BASELINE, cpu),
            "{:.2f}x",
            lambda v: v <= 0.5,
        )
    if "W1-8MiB" in by_key:
        judge(
            "W1-8MiB",
            "W1 8 MiB x32 req/s",
            "≥1.4x FastAPI",
            grid.ratio("W1-8MiB", SUBJECT, BASELINE, rps),
            "{:.2f}x",
            lambda v: v >= 1.4,
        )
        judge(
            "W1-8MiB",
            "W1 8 MiB x32 peak RSS",
            f"≤{W1_8MIB_RSS_CAP_MIB} MiB",
            grid.med("W1-8MiB", SUBJECT, lambda r: r.peak_rss_mib),
            "{:.0f} MiB",
            lambda v: v <= W1_8MIB_RSS_CAP_MIB,
        )
    if by_key:
        worst = max((grid.copied_pct(k, SUBJECT) for k in by_key), default=math.nan)
        rows.append(
            Target(
                "W1 copies (Content-Length bodies)",
                "≤2% of payload bytes",
                worst,
                "{:.2f}% (worst size)",
                lambda v: v <= 2.0,
            )
        )
    lines = [
        "### W1",
        "",
        "Raw echo, `POST /v1/raw/echo`, body from a file (wrk + Lua).",
        "",
        *echo_table(grid, cases, servers),
        *targets(rows),
        *copies_by_site(grid, cases),
        *skipped(grid),
        *footer(ctx, settings, notes),
    ]
    return Section(GROUP, TITLE, "\n".join(lines))
