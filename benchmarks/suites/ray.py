"""RAY: ``executor="ray"`` on the ingress's node against ``executor="process"``: a 4 MiB
float32 KServe V2 binary infer through ``echo`` and a 256-token raw SSE stream.

Each zeroserve starts its own local Ray (no ``RAY_ADDRESS``), as one command on a laptop
does; the actors attach the arena, so the targets are the process executor's: the same
throughput within 20 % and copies under 2 % of the payload (docs/architecture.md,
"Executors: ray"). Ray Serve is not measured: zeroserve has no Serve deployments yet.
"""

from __future__ import annotations

import dataclasses
import json

from ..context import SuiteContext
from ..report import Section, cpu, fixed, footer, mark, p, rps
from ..runner import run_grid
from ..scenarios import SCENARIOS
from ..servers import zeroserve
from ._runtime import GROUP, TITLE
from .w4 import w4_cases

# The targets (same run, same machine): Ray actors on the ingress's node keep at least
# 0.8x the process executor's infer throughput and copy at most 2 % of the payload.
RAY_RATIO_TARGET = 0.8
RAY_COPY_TARGET = 0.02
STREAM_TOKENS = 256
EXECUTORS = ("process", "ray")


def ray(ctx: SuiteContext) -> Section:
    settings = ctx.settings()
    binary = dataclasses.replace(w4_cases()[0], key="RAY-v2-4MiB", scenario="RAY")
    (sse,) = [c for c in SCENARIOS["W2"]() if c.key == "W2-sse-c32"]
    stream = dataclasses.replace(sse, key="RAY-sse-256", scenario="RAY")
    specs = [
        zeroserve(
            f"echo=zeroserve.models.echo:EchoModel?executor={ex}&workers=1",
            name=f"zeroserve-{ex}",
            title=f"zeroserve {ex}",
        )
        for ex in EXECUTORS
    ]
    grid = run_grid(specs, [binary, stream], settings)
    (ctx.results_dir / "runtime-RAY.json").write_text(
        json.dumps(grid.to_json(), indent=1, default=str)
    )
    lines = [
        "### RAY: Ray actors on the same node vs process workers",
        "",
        f"`echo` with one worker. Infer: `POST /v2/models/echo/infer`, 4 MiB FP32 binary, "
        f"{binary.connections} connections. Stream: raw SSE of {STREAM_TOKENS} tokens, "
        f"{stream.connections} connections. {settings.rounds} interleaved round(s) of "
        f"{settings.duration_s} s, medians.",
        "",
        "| case | executor | req/s | tokens/s | p50 / p99 ms | first event p99 ms | "
        "CPU ms/req | copied % of payload in |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for case in (binary, stream):
        for spec in specs:
            k, n = case.key, spec.name
            if not grid.ok(k, n):
                lines.append(
                    f"| {case.label} | {n.removeprefix('zeroserve-')} | {grid.why(k, n)} ||||||"
                )
                continue
            rate = grid.med(k, n, rps)
            toks = fixed(rate * STREAM_TOKENS) if case is stream else "-"
            first = fixed(grid.first_event(k, n, 99)) if case is stream else "-"
            lines.append(
                f"| {case.label} | {n.removeprefix('zeroserve-')} | {fixed(rate)} | {toks} | "
                f"{fixed(grid.med(k, n, p(50)))} / {fixed(grid.med(k, n, p(99)))} | {first} | "
                f"{fixed(grid.med(k, n, cpu), 2)} | {fixed(grid.copied_pct(k, n), 3)}% |"
            )
    targets = []
    near, base = "zeroserve-ray", "zeroserve-process"
    if grid.ok(binary.key, near) and grid.ok(binary.key, base):
        ratio = grid.ratio(binary.key, near, base, rps)
        targets.append(
            f"- ray ≥{RAY_RATIO_TARGET}x process req/s (4 MiB V2 binary): {fixed(ratio, 2)}x — "
            f"{mark(ratio >= RAY_RATIO_TARGET)}"
        )
    if grid.ok(binary.key, near):
        share = grid.copied_pct(binary.key, near) / 100
        targets.append(
            f"- ray copies ≤{100 * RAY_COPY_TARGET:g}% of payload: {fixed(100 * share, 3)}% — "
            f"{mark(share <= RAY_COPY_TARGET)}"
        )
    if grid.ok(stream.key, near) and grid.ok(stream.key, base):
        ratio = grid.ratio(stream.key, near, base, rps)
        targets.append(f"- ray / process stream tokens/s: {fixed(ratio, 2)}x (no target)")
    return Section(GROUP, TITLE, "\n".join([*lines, "", *targets, *footer(ctx, settings)]))
