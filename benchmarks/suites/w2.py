"""W2: 256-token streams (raw SSE and OpenAI completion chunks) at 32 and 256 concurrent
streams (wrk), with a new client's first event probed under the load."""

from __future__ import annotations

from collections.abc import Callable

from ..context import SuiteContext
from ..report import Section, Target, eps, first_event_note, footer, skipped, targets
from ..scenarios import W2_TOKENS
from ..servers import BASELINE, SUBJECT
from ._scenario import GROUP, TITLE, copies_by_site, run, stream_table

# (case, label, tokens/s goal against FastAPI, new client's first event p99 goal in ms
# under that load: 10 at 32 streams, 60 at 256)
GOALS = (
    ("W2-sse-c32", "W2 raw SSE x32", 6.0, 10.0),
    ("W2-openai-c32", "W2 OpenAI chunks x32", 5.0, 10.0),
    ("W2-openai-c256", "W2 OpenAI chunks x256", 5.0, 60.0),
)


def _at_least(goal: float) -> Callable[[float], bool]:
    return lambda v: v >= goal


def _at_most(goal: float) -> Callable[[float], bool]:
    return lambda v: v <= goal


def w2(ctx: SuiteContext) -> Section:
    cases, servers, grid, settings, notes = run(ctx, "W2")
    rows: list[Target] = []
    for key, label, goal, first_ms in GOALS:
        if not grid.ok(key, SUBJECT):
            continue
        share = grid.error_share(key, SUBJECT)
        if "sse" in key and grid.ok(key, "granian"):
            rows.append(
                Target(
                    f"{label} tokens/s",
                    "≥ granian RSGI's (measured in this run)",
                    grid.ratio(key, SUBJECT, "granian", eps),
                    "{:.2f}x granian",
                    lambda v: v >= 1.0,
                    error_share=share,
                )
            )
        text = "≥6x FastAPI (granian RSGI's low end)" if "sse" in key else "≥5x FastAPI+pydantic"
        rows.append(
            Target(
                f"{label} tokens/s",
                text,
                grid.ratio(key, SUBJECT, BASELINE, eps),
                "{:.2f}x",
                _at_least(goal),
                error_share=share,
            )
        )
        rows.append(
            Target(
                f"{label} new client first event p99",
                f"≤{first_ms:g} ms",
                grid.first_event(key, SUBJECT, 99),
                "{:.1f} ms",
                _at_most(first_ms),
                error_share=share,
            )
        )
    lines = [
        "### W2",
        "",
        f"{W2_TOKENS} space-separated tokens → {W2_TOKENS} events per request, "
        f"`Accept: text/event-stream`. Tokens/s = completed streams/s x {W2_TOKENS}. "
        "First event: a new connection opened repeatedly while the load runs, "
        f"time from connect to the first `data:`. {first_event_note(grid)}".rstrip(),
        "",
        *stream_table(grid, cases, servers),
        *targets(rows),
        *copies_by_site(grid, cases),
        *skipped(grid),
        *footer(ctx, settings, notes),
    ]
    return Section(GROUP, TITLE, "\n".join(lines))
