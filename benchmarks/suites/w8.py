"""W8: ``GET /health`` while a CPU-bound model is saturated."""

from __future__ import annotations

import math
import threading
import time
from typing import Any

from .. import wrk
from ..context import SuiteContext
from ..procs import ServerFailed, ServerProcess
from ..report import Section, fixed, footer, mark, probe_note
from ..stats import percentile
from ._health import PROBE_INTERVAL_S, PROBE_SLACK_S, HealthProbe
from ._runtime import (
    GROUP,
    MODELS,
    TITLE,
    fastapi_available,
    save_json,
    start_fastapi,
    start_zeroserve,
)

# W8: SpinModel at 20 ms of CPU per request; /health probed every 5 ms.
W8_SPIN_MS = 20.0
# Seconds of model load per server (long enough for a /health p99 over ~1,800 probes).
W8_LOAD_S, QUICK_W8_LOAD_S = 10.0, 3.0
# Seconds of /health probing on the idle server, before the load starts.
W8_IDLE_PROBE_S = 1.0

W8_TARGET_MS = 2.0


def _w8_one(
    ctx: SuiteContext,
    server: ServerProcess,
    probe: HealthProbe,
    conns: int,
    seconds: float,
) -> dict[str, Any]:
    work = ctx.results_dir / "work"
    work.mkdir(parents=True, exist_ok=True)
    body = work / "w8.body"
    body.write_bytes(b"x")
    script = wrk.write_script(work / "w8.lua", body, {"Content-Type": "application/octet-stream"})
    idle, idle_fail = probe.start(server.port, W8_IDLE_PROBE_S).result(
        timeout=W8_IDLE_PROBE_S + PROBE_SLACK_S
    )
    out: list[wrk.WrkResult] = []
    errors: list[str] = []

    def load() -> None:
        try:
            out.append(
                wrk.run(
                    script,
                    server.port,
                    "/v1/raw/spin",
                    conns,
                    math.ceil(seconds),
                    ctx.pins.load_cpu,
                )
            )
        except (OSError, RuntimeError) as exc:
            errors.append(str(exc))

    t = threading.Thread(target=load, name="w8-wrk", daemon=True)
    u0 = server.usage()
    t.start()
    time.sleep(0.5)
    window = max(0.5, math.ceil(seconds) - 1.0)
    busy, busy_fail = probe.start(server.port, window).result(timeout=window + PROBE_SLACK_S)
    t.join(timeout=math.ceil(seconds) + wrk.WRK_SLACK_S)
    u1 = server.usage()
    res = out[0] if out else None
    return {
        "idle_p50_ms": percentile(idle, 50),
        "idle_p99_ms": percentile(idle, 99),
        "idle_n": len(idle),
        "p50_ms": percentile(busy, 50),
        "p99_ms": percentile(busy, 99),
        "max_ms": percentile(busy, 100),
        "n": len(busy),
        "failures": busy_fail + idle_fail,
        "model_rps": res.rps if res else math.nan,
        "model_errors": res.error_count if res else -1,
        "cpu_s": u1.cpu_s - u0.cpu_s,
        "error": "; ".join(errors),
    }


def w8(ctx: SuiteContext) -> Section:
    with HealthProbe() as probe:
        rows = _measure(ctx, probe)
    return _section(ctx, rows, probe.priority)


def _measure(ctx: SuiteContext, probe: HealthProbe) -> list[dict[str, Any]]:
    seconds = QUICK_W8_LOAD_S if ctx.quick else W8_LOAD_S
    configs = (1,) if ctx.quick else (1, 2)
    rows: list[dict[str, Any]] = []
    for workers in configs:
        conns = 4 * workers
        row: dict[str, Any] = {"server": "zeroserve", "workers": workers, "conns": conns}
        rows.append(row)
        try:
            server = start_zeroserve(
                ctx,
                f"w8-w{workers}",
                [f"spin={MODELS}:SpinModel?executor=process&workers={workers}&ms={W8_SPIN_MS:g}"],
            )
        except ServerFailed as exc:
            row["error"] = str(exc)[:300]
            continue
        try:
            row.update(_w8_one(ctx, server, probe, conns, seconds))
        finally:
            server.stop()
    if fastapi_available():
        row = {"server": "fastapi", "workers": "threadpool", "conns": 4}
        rows.append(row)
        try:
            server = start_fastapi(ctx, "w8-fastapi", spin_ms=W8_SPIN_MS)
            try:
                row.update(_w8_one(ctx, server, probe, 4, seconds))
            finally:
                server.stop()
        except (ServerFailed, OSError) as exc:
            row["error"] = str(exc)[:300]
    save_json(ctx, "W8", rows)
    return rows


def _section(ctx: SuiteContext, rows: list[dict[str, Any]], priority: str) -> Section:
    seconds = QUICK_W8_LOAD_S if ctx.quick else W8_LOAD_S
    lines = [
        "### W8: `GET /health` while a CPU-bound model is saturated",
        "",
        f"`SpinModel`: {W8_SPIN_MS:g} ms of pure-Python loops per request (GIL held) on the "
        f"process executor; wrk keeps 4 requests per worker outstanding for {seconds:.0f} s "
        f"while a probe sends `GET /health` every {PROBE_INTERVAL_S * 1000:g} ms on one "
        "keep-alive connection from a process of its own (time from send to the whole "
        f"response). {probe_note('probe', priority)} FastAPI: a sync `def` "
        "endpoint running the same loop (its threadpool), `/health` an `async def`. The "
        "server and its workers share CPU 0, so the OS scheduler, not only the GIL, sits "
        "between a /health request and the loop.",
        "",
        "| server | workers | model req/s | /health idle p50 / p99 ms | /health loaded p50 / "
        "p99 / max ms | probes | failures | target p99 ≤2 ms |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        if "p99_ms" not in r:
            lines.append(
                f"| {r['server']} | {r['workers']} | failed: {r.get('error', '')[:200]} |||||| "
            )
            continue
        verdict = mark(r["p99_ms"] <= W8_TARGET_MS) if r["server"] == "zeroserve" else "(peer)"
        lines.append(
            f"| {r['server']} | {r['workers']} | {fixed(r['model_rps'])} | "
            f"{fixed(r['idle_p50_ms'], 2)} / {fixed(r['idle_p99_ms'], 2)} | {fixed(r['p50_ms'], 2)} / "
            f"{fixed(r['p99_ms'], 2)} / {fixed(r['max_ms'], 2)} | {r['n']} | {r['failures']} | "
            f"{verdict} |"
        )
    zs = [r for r in rows if r["server"] == "zeroserve" and "p99_ms" in r]
    fa = [r for r in rows if r["server"] == "fastapi" and "p99_ms" in r]
    notes = []
    if zs and fa and zs[0]["p99_ms"] > 0:
        notes.append(
            f"Same run: FastAPI's /health p99 is {fa[0]['p99_ms'] / zs[0]['p99_ms']:.1f}x "
            f"zeroserve's ({fixed(fa[0]['p99_ms'], 2)} vs {fixed(zs[0]['p99_ms'], 2)} ms)."
        )
    return Section(GROUP, TITLE, "\n".join(lines + footer(ctx, notes=notes)))
