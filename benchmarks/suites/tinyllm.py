"""The default model: tinyllm chat streams at 1, 8 and 32 concurrent streams, zeroserve
against FastAPI running the same model object, measured with the harness's stream client."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import math
import subprocess
import sys

from ..context import SuiteContext
from ..procs import ServerFailed
from ..report import Section, footer, num, probe_note, times
from ..servers import BASELINE, Server, fastapi_peer, started, zeroserve
from ..stats import median, percentile
from ..streamclient import StreamStats, stream_load
from ._api import GROUP, GROUP_TITLE
from ._health import PROBE_SLACK_S, HealthProbe, floor_lines, measure_floor

# Default model streams: greedy decoding, so every server generates the same text.
TINYLLM_CONCURRENCY = (1, 8, 32)

TINYLLM_PROMPT = "str.split"
TINYLLM_MAX_TOKENS, QUICK_TINYLLM_MAX_TOKENS = 64, 32
# /health p99 target while the streams run (ms).
HEALTH_TARGET_MS = 2.0


def _tinyllm_body(max_tokens: int) -> bytes:
    return json.dumps(
        {
            "model": "tinyllm",
            "stream": True,
            "max_tokens": max_tokens,
            "temperature": 0,
            "messages": [{"role": "user", "content": TINYLLM_PROMPT}],
        }
    ).encode()


def _realtime_refused() -> str | None:
    """Why ``--loop-rt-priority`` cannot run here (tried in a throwaway process), or None."""
    probe = "import os; os.sched_setscheduler(0, os.SCHED_RR, os.sched_param(1))"
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, timeout=30)
    if done.returncode:
        return "real-time scheduling is not permitted here (CAP_SYS_NICE or ulimit -r)"
    return None


def tinyllm(ctx: SuiteContext) -> Section:
    max_tokens = QUICK_TINYLLM_MAX_TOKENS if ctx.quick else TINYLLM_MAX_TOKENS
    realtime = zeroserve(
        "tinyllm?queue_depth=1024",
        name="zeroserve-rt",
        title="zeroserve --loop-rt-priority 1",
        extra=("--loop-rt-priority", "1"),
    )
    servers = [
        zeroserve("tinyllm?queue_depth=1024"),
        dataclasses.replace(realtime, missing=_realtime_refused),
        fastapi_peer("--tinyllm"),
    ]
    body = _tinyllm_body(max_tokens)
    res: dict[tuple[int, str], list[StreamStats]] = {}
    health: dict[tuple[int, str], list[float]] = {}  # /health latencies, ms
    errors: dict[str, str] = {}
    skipped = {s.name: why for s in servers if (why := s.missing())}
    floor: dict[str, list[float]] = {}
    probe = HealthProbe()
    try:
        _measure(ctx, servers, body, probe, res, health, errors, skipped, floor)
    finally:
        probe.close()
    return _section(ctx, servers, max_tokens, res, health, errors, skipped, floor, probe.priority)


def _measure(
    ctx: SuiteContext,
    servers: list[Server],
    body: bytes,
    probe: HealthProbe,
    res: dict[tuple[int, str], list[StreamStats]],
    health: dict[tuple[int, str], list[float]],
    errors: dict[str, str],
    skipped: dict[str, str],
    floor: dict[str, list[float]],
) -> None:
    settings = ctx.settings()
    concs = TINYLLM_CONCURRENCY
    for rnd in range(settings.rounds):
        measure_floor(ctx, settings, probe, floor, errors)
        for conc in concs:
            for srv in servers:
                if srv.name in skipped or srv.name in errors:
                    continue
                try:
                    with started(srv, ctx.pins, ctx.results_dir) as server:
                        # warm-up: one stream, so load and first-call costs are outside
                        asyncio.run(stream_load(server.port, "/v1/chat/completions", body, 1, 0.01))
                        probing = probe.start(server.port, max(settings.duration_s - 0.5, 0.5))
                        st = asyncio.run(
                            stream_load(
                                server.port, "/v1/chat/completions", body, conc, settings.duration_s
                            )
                        )
                        window = probing.result(timeout=settings.duration_s + PROBE_SLACK_S)
                        lat = window.latencies_ms
                except ServerFailed as exc:
                    errors[srv.name] = f"start failed: {exc}"
                    continue
                res.setdefault((conc, srv.name), []).append(st)
                health.setdefault((conc, srv.name), []).extend(lat)
                print(
                    f"  tinyllm x{conc} {srv.name} r{rnd}: {st.tokens / st.duration_s:,.0f} "
                    f"tokens/s, {st.streams} streams, ttft p50 "
                    f"{percentile(st.ttft_ms, 50):.1f} ms, /health p99 "
                    f"{percentile(lat, 99):.2f} ms, {st.failures} failures {st.errors[:1]}",
                    flush=True,
                )


def _section(
    ctx: SuiteContext,
    servers: list[Server],
    max_tokens: int,
    res: dict[tuple[int, str], list[StreamStats]],
    health: dict[tuple[int, str], list[float]],
    errors: dict[str, str],
    skipped: dict[str, str],
    floor: dict[str, list[float]],
    probe_priority: str,
) -> Section:
    settings = ctx.settings()
    concs = TINYLLM_CONCURRENCY

    def tps(conc: int, name: str) -> list[float]:
        return [s.tokens / s.duration_s for s in res.get((conc, name), [])]

    lines = [
        "### Default model: tinyllm streams",
        "",
        f"`POST /v1/chat/completions` with `stream: true`, `{TINYLLM_PROMPT}` as the user "
        f"message, `temperature` 0 (greedy: every server generates the same text), "
        f"`max_tokens` {max_tokens}. Client: this module's asyncio client, one fresh "
        "connection per stream, N streams back to back for the window. Tokens: chunks "
        "with non-empty `delta.content` received inside the window. TTFT: connect to the "
        "first content chunk. Inter-token: the gap between two content chunks of a stream as "
        "the client read them (chunks arriving in one read are 0 ms apart). FastAPI runs the same model object "
        "(`zeroserve.models.tinyllm`) behind a `StreamingResponse` over a sync iterator "
        "(thread pool); zeroserve runs it on its default executor (`process`). "
        "`--loop-rt-priority 1` is the same server with its event loop thread real-time "
        "(SCHED_RR; measured only where that is permitted): on the one shared core the kernel "
        "otherwise makes the woken loop wait for the worker (docs/deploy.md).",
        *footer(ctx, settings),
        "",
        "| streams | server | tokens/s | vs FastAPI | TTFT p50 ms | TTFT p99 ms "
        "| inter-token p99 ms "
        f"| /health p99 ms (target ≤{HEALTH_TARGET_MS:g}) | streams done | failures |",
        "|--:|---|--:|--:|--:|--:|--:|--:|--:|--:|",
    ]
    for conc in concs:
        for srv in servers:
            runs = res.get((conc, srv.name), [])
            if not runs:
                why = skipped.get(srv.name) or errors.get(srv.name, "no result")
                lines.append(
                    f"| {conc} | {srv.title} | not measured: "
                    f"{why.splitlines()[0][:140]} | | | | | | | |"
                )
                continue
            ratios = [
                a / b for a, b in zip(tps(conc, srv.name), tps(conc, BASELINE), strict=False) if b
            ]
            ttft = [x for s in runs for x in s.ttft_ms]
            itl = [x for s in runs for x in s.itl_ms]
            lines.append(
                f"| {conc} | {srv.title} | {num(median(tps(conc, srv.name)))} "
                f"| {times(median(ratios) if ratios else math.nan)} "
                f"| {num(percentile(ttft, 50))} | {num(percentile(ttft, 99))} "
                f"| {num(percentile(itl, 99))} | {num(percentile(health.get((conc, srv.name), []), 99))} "
                f"| {sum(s.streams for s in runs)} | {sum(s.failures for s in runs)} |"
            )
    lines += [
        "",
        f"Target: `/health` p99 ≤{HEALTH_TARGET_MS:g} ms while the streams run, probed every "
        "5 ms on one keep-alive connection from a process of its own. "
        f"{probe_note('probe', probe_priority)} Tokens/s: no numeric target, these are the "
        "numbers against FastAPI.",
    ]
    lines += floor_lines(floor, errors, probe_priority)
    return Section(GROUP, GROUP_TITLE, "\n".join(lines))
