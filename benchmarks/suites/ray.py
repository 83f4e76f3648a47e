"""RAY: ``executor="ray"`` on the ingress's node against ``executor="process"``: a 4 MiB
float32 KServe V2 binary infer through ``echo`` and a 256-token raw SSE stream; then the
same infer through ``executor="ray-serve"`` and through Ray Serve's own HTTP path (its
proxy and a FastAPI ingress deployment calling an identity deployment's handle, as
Serve's users write it: ``benchmarks/peers/rayserve_app.py``).

Each server starts its own local Ray (no ``RAY_ADDRESS``), as one command on a laptop
does; the actors attach the arena, so the targets are the process executor's: the same
throughput within 20 % and copies under 2 % of the payload (docs/architecture.md,
"Executors: ray"); and against Serve's HTTP path, 5x its req/s with a p99 under its p50.
Serve's copies are not instrumented (the peer has no copy counters).
"""

from __future__ import annotations

import dataclasses
import json

from ..context import SuiteContext
from ..report import Section, cpu, first_event_note, fixed, footer, mark, p, rps
from ..runner import run_grid
from ..scenarios import SCENARIOS
from ..servers import EXTERNAL_READY_TIMEOUT_S, Server, at_baseline, peer, zeroserve
from ._runtime import GROUP, TITLE
from .w4 import w4_cases

# The targets (same run, same machine): Ray actors on the ingress's node keep at least
# 0.8x the process executor's infer throughput and copy at most 2 % of the payload.
RAY_RATIO_TARGET = 0.8
RAY_COPY_TARGET = 0.02
STREAM_TOKENS = 256
EXECUTORS = ("process", "ray")
# zeroserve on Ray actors against Ray Serve's own HTTP path, same 4 MiB infer, same run.
SERVE_RPS_TARGET = 5.0
SERVE_PEER = "rayserve-http"


def serve_peer() -> Server:
    """Ray Serve's HTTP proxy + FastAPI ingress (it starts Ray and Serve: slow to be up)."""
    return dataclasses.replace(
        peer("rayserve_app", SERVE_PEER, "Ray Serve HTTP + FastAPI", ("ray.serve", "fastapi")),
        ready_timeout_s=EXTERNAL_READY_TIMEOUT_S,
    )


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
    # With ZSBENCH_BASELINE_SRC: each executor from that tree too, in the same rounds.
    bases = [at_baseline(s, f"{s.name}@base", f"{s.title}@base") for s in specs]
    grid = run_grid([*specs, *(b for b in bases if b is not None)], [binary, stream], settings)
    elastic = zeroserve(
        "echo=zeroserve.models.echo:EchoModel?executor=ray-serve",
        name="zeroserve-ray-serve",
        title="zeroserve ray-serve",
    )
    serve_grid = run_grid([specs[1], elastic, serve_peer()], [binary], settings)
    (ctx.results_dir / "runtime-RAY.json").write_text(
        json.dumps(
            {"executors": grid.to_json(), "serve": serve_grid.to_json()}, indent=1, default=str
        )
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
        for spec in [*specs, *(b for b in bases if b is not None)]:
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
    note = first_event_note(grid)
    if note:
        lines += [
            "",
            "First event: a new connection opened repeatedly while the stream load runs, "
            f"time from connect to the first `data:`. {note}",
        ]
    lines += [
        "",
        f"Against Ray Serve (second grid, same run): the same 4 MiB V2 binary infer, "
        f"{binary.connections} connections.",
        "",
        "| server | req/s | p50 / p99 ms | CPU ms/req | copied % of payload in |",
        "|---|---|---|---|---|",
    ]
    for name, title in (
        ("zeroserve-ray", "zeroserve, executor=ray"),
        ("zeroserve-ray-serve", "zeroserve, executor=ray-serve"),
        (SERVE_PEER, "Ray Serve HTTP proxy + FastAPI ingress"),
    ):
        k = binary.key
        if not serve_grid.ok(k, name):
            why = serve_grid.skipped.get(name) or serve_grid.why(k, name)
            lines.append(f"| {title} | {why} ||||")
            continue
        copied = (
            "not instrumented"
            if name == SERVE_PEER
            else (f"{fixed(serve_grid.copied_pct(k, name), 3)}%")
        )
        lines.append(
            f"| {title} | {fixed(serve_grid.med(k, name, rps))} | "
            f"{fixed(serve_grid.med(k, name, p(50)))} / {fixed(serve_grid.med(k, name, p(99)))} | "
            f"{fixed(serve_grid.med(k, name, cpu), 2)} | {copied} |"
        )
    targets = []
    near, base = "zeroserve-ray", "zeroserve-process"
    if serve_grid.ok(binary.key, near) and serve_grid.ok(binary.key, SERVE_PEER):
        ratio = serve_grid.ratio(binary.key, near, SERVE_PEER, rps)
        p99 = serve_grid.med(binary.key, near, p(99))
        p50 = serve_grid.med(binary.key, SERVE_PEER, p(50))
        targets.append(
            f"- ray ≥{SERVE_RPS_TARGET:g}x Ray Serve's HTTP path req/s (4 MiB): "
            f"{fixed(ratio, 2)}x — {mark(ratio >= SERVE_RPS_TARGET)}"
        )
        targets.append(
            f"- ray p99 ≤ Ray Serve's p50: {fixed(p99)} vs {fixed(p50)} ms — {mark(p99 <= p50)}"
        )
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
    for spec, b in zip(specs, bases, strict=True):
        if b is None:
            continue
        for case in (binary, stream):
            if grid.ok(case.key, spec.name) and grid.ok(case.key, b.name):
                ratio = grid.ratio(case.key, spec.name, b.name, rps)
                targets.append(
                    f"- {spec.title} against {b.title}, {case.label}: {fixed(ratio, 2)}x "
                    "(an A/B of a change, same rounds)"
                )
    return Section(GROUP, TITLE, "\n".join([*lines, "", *targets, *footer(ctx, settings)]))
