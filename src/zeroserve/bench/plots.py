"""PNG plots of one run: latency CDFs and throughput against concurrency (matplotlib).

Skipped, with a note, when matplotlib is not importable.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from .report import Results
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


def write_plots(res: Results, out_dir: Path) -> list[str]:
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
    for case in res.cases:
        fig, ax = plt.subplots(figsize=(6.4, 4.0))
        drawn = False
        for spec in res.servers:
            cell = res.cell(case, spec.name)
            if cell is None or not cell.ok_runs:
                continue
            runs = sorted(cell.ok_runs, key=lambda r: r.rps)
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
    for case in [c for c in res.cases if c.probe_first_event]:
        fig, ax = plt.subplots(figsize=(6.4, 4.0))
        drawn = False
        for spec in res.servers:
            cell = res.cell(case, spec.name)
            samples = sorted(x for r in (cell.ok_runs if cell else []) for x in r.first_event_ms)
            if not samples:
                continue
            ax.plot(samples, [(i + 1) / len(samples) for i in range(len(samples))],
                    label=f"{spec.title} (n={len(samples)})")
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
    for case in res.cases:
        if case.group:
            groups.setdefault(case.group, []).append(case)
    for group, cases in groups.items():
        if len(cases) < 2:
            continue
        fig, ax = plt.subplots(figsize=(6.4, 4.0))
        for spec in res.servers:
            pts = []
            for case in cases:
                cell = res.cell(case, spec.name)
                if cell is not None and cell.ok_runs:
                    pts.append((case.connections, cell.med(lambda r: r.events_per_s)))
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
