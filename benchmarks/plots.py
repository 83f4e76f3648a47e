"""PNG plots of one run: latency CDFs and throughput against concurrency (matplotlib).

Skipped, with a note, when matplotlib is not importable.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from .runner import Grid
from .scenarios import Case
from .servers import Server
from .wrk import PERCENTILES


def _pyplot() -> Any:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    return plt


def available() -> bool:
    return _pyplot() is not None


def write_plots(
    grid: Grid, cases: Sequence[Case], servers: Sequence[Server], out_dir: Path
) -> list[str]:
    """Write the plots; return their file names."""
    plt = _pyplot()
    if plt is None:
        return []
    out_dir.mkdir(parents=True, exist_ok=True)
    written: list[str] = []

    def save(fig: Any, name: str) -> None:
        fig.tight_layout()
        fig.savefig(out_dir / name, dpi=110)
        plt.close(fig)
        written.append(name)

    # Request latency CDF per case: the round with the median throughput, per server.
    for case in cases:
        fig, ax = plt.subplots(figsize=(6.4, 4.0))
        drawn = False
        for spec in servers:
            ok = grid.ok(case.key, spec.name)
            if not ok:
                continue
            runs = sorted(ok, key=lambda r: r.rps)
            run = runs[len(runs) // 2]
            xs = [run.latency_pct_ms.get(float(p), math.nan) for p in PERCENTILES]
            ax.plot(xs, [p / 100 for p in PERCENTILES], marker=".", label=spec.title)
            drawn = True
        if drawn:
            ax.set_xscale("log")
            ax.set_xlabel("request latency, ms (log)")
            ax.set_ylabel("fraction of requests")
            ax.set_title(f"{case.scenario} {case.label}: latency CDF")
            ax.grid(True, which="both", alpha=0.3)
            ax.legend()
            save(fig, f"cdf-{case.key}.png")
        else:
            plt.close(fig)

    # First-event latency CDF for a new client, pooled over rounds.
    for case in [c for c in cases if c.probe_first_event]:
        fig, ax = plt.subplots(figsize=(6.4, 4.0))
        drawn = False
        for spec in servers:
            samples = sorted(x for r in grid.ok(case.key, spec.name) for x in r.first_event_ms)
            if not samples:
                continue
            ax.plot(
                samples,
                [(i + 1) / len(samples) for i in range(len(samples))],
                label=f"{spec.title} (n={len(samples)})",
            )
            drawn = True
        if drawn:
            ax.set_xscale("log")
            ax.set_xlabel("new client's first event, ms (log)")
            ax.set_ylabel("fraction of probes")
            ax.set_title(f"{case.scenario} {case.label}: first event under load")
            ax.grid(True, which="both", alpha=0.3)
            ax.legend()
            save(fig, f"first-event-{case.key}.png")
        else:
            plt.close(fig)

    # Throughput against concurrency, one figure per group of cases.
    groups: dict[str, list[Any]] = {}
    for case in cases:
        if case.group:
            groups.setdefault(case.group, []).append(case)
    for group, group_cases in groups.items():
        if len(group_cases) < 2:
            continue
        fig, ax = plt.subplots(figsize=(6.4, 4.0))
        for spec in servers:
            pts = []
            for case in group_cases:
                if grid.ok(case.key, spec.name):
                    pts.append(
                        (case.connections, grid.med(case.key, spec.name, lambda r: r.events_per_s))
                    )
            if pts:
                ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=spec.title)
        ax.set_xscale("log", base=2)
        ax.set_xlabel("concurrent streams")
        ax.set_ylabel("tokens/s")
        ax.set_title(f"W2 {group}: throughput vs concurrency")
        ax.grid(True, alpha=0.3)
        ax.legend()
        save(fig, f"throughput-{group.replace(' ', '-').lower()}.png")
    return written
