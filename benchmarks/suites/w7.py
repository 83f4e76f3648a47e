"""W7: 10x overload of a model with a known capacity: fast rejections, admitted latency kept."""

from __future__ import annotations

import asyncio
import math
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ..context import SuiteContext
from ..procs import LOOPBACK, ServerFailed, ServerProcess
from ..report import Section, fixed, footer, mark
from ..stats import percentile
from ._runtime import (
    GROUP,
    IO_TIMEOUT_S,
    MODELS,
    TITLE,
    fastapi_available,
    raw_request,
    run_async,
    save_json,
    start_fastapi,
    start_zeroserve,
)

# W7: SleepModel at 10 ms, one worker: capacity 100 req/s; load at 10x.
W7_SERVICE_MS = 10.0

W7_OVERLOAD = 10.0

W7_MAX_CONNS = 128

W7_DRAIN_S = 5.0  # after the load window, outstanding requests get this long

W7_FAST_MS = 5.0


@dataclass
class LoadResult:
    sent: int = 0
    # (status, latency from send s, latency from the scheduled time s)
    samples: list[tuple[int, float, float]] = field(default_factory=list)
    errors: int = 0
    unfinished: int = 0
    max_slip_ms: float = 0.0
    connections: int = 0
    duration_s: float = 0.0

    def latencies_ms(self, pred: Callable[[int], bool], scheduled: bool = False) -> list[float]:
        return [(sch if scheduled else sent) * 1000 for st, sent, sch in self.samples if pred(st)]


async def _exchange(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, req: bytes
) -> tuple[int, bool]:
    writer.write(req)
    head = (await reader.readuntil(b"\r\n\r\n")).lower()
    m = re.search(rb"content-length:\s*(\d+)", head)
    n = int(m.group(1)) if m else 0
    if n:
        await reader.readexactly(n)
    return int(head[9:12]), b"connection: close" in head


async def _load(
    port: int, req: bytes, rate: float | None, count: int, conns: int, drain_s: float
) -> LoadResult:
    """``count`` requests: open loop at ``rate``/s over up to ``conns`` keep-alive
    connections, or closed loop (one after another) when ``rate`` is None. Latency is
    kept from the send (connection in hand) and from the request's scheduled time (open
    loop: includes waiting for a connection, connecting, and the client's own lag)."""
    res = LoadResult()
    idle: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = []
    sem = asyncio.Semaphore(conns)
    every: list[asyncio.StreamWriter] = []

    async def one(t_sched: float) -> None:
        async with sem:
            if idle:
                conn = idle.pop()
            else:
                conn = await asyncio.open_connection(LOOPBACK, port)
                every.append(conn[1])
            t_send = time.monotonic()
            try:
                status, close = await _exchange(conn[0], conn[1], req)
            except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError):
                res.errors += 1
                conn[1].close()
                return
            now = time.monotonic()
            res.samples.append((status, now - t_send, now - t_sched))
            if close:
                conn[1].close()
            else:
                idle.append(conn)

    start = time.monotonic() + 0.02
    tasks: list[asyncio.Task[None]] = []
    for i in range(count):
        if rate is None:
            await one(time.monotonic())
            continue
        t = start + i / rate
        delay = t - time.monotonic()
        if delay > 0:
            await asyncio.sleep(delay)
        res.max_slip_ms = max(res.max_slip_ms, (time.monotonic() - t) * 1000)
        tasks.append(asyncio.create_task(one(t)))
    res.sent = count
    if tasks:
        _, pending = await asyncio.wait(tasks, timeout=drain_s)
        res.unfinished = len(pending)
        for p in pending:
            p.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
    res.duration_s = time.monotonic() - start
    res.connections = len(every)
    for w in every:
        w.close()
    return res


def _w7_one(
    server: ServerProcess,
    path: str,
    overload_s: float,
    unloaded_n: int,
) -> dict[str, Any]:
    req = raw_request("POST", path, b"x", {"Content-Type": "application/octet-stream"})
    unloaded: LoadResult = run_async(_load(server.port, req, None, unloaded_n, 1, IO_TIMEOUT_S))
    rate = W7_OVERLOAD * 1000.0 / W7_SERVICE_MS
    time.sleep(0.2)
    rss0 = server.usage().rss_kib
    server.start_sampling()
    try:
        loaded: LoadResult = run_async(
            _load(server.port, req, rate, int(rate * overload_s), W7_MAX_CONNS, W7_DRAIN_S)
        )
    finally:
        peak = server.stop_sampling()
    time.sleep(1.0)
    rss1 = server.usage().rss_kib
    ok = loaded.latencies_ms(lambda s: 200 <= s < 300)
    rej = loaded.latencies_ms(lambda s: s in (429, 503))
    other = len(loaded.samples) - len(ok) - len(rej)
    base_p99 = percentile(unloaded.latencies_ms(lambda s: s == 200), 99)
    return {
        "rate": rate,
        "sent": loaded.sent,
        "ok": len(ok),
        "rejected": len(rej),
        "other_status": other,
        "errors": loaded.errors,
        "unfinished": loaded.unfinished,
        "max_slip_ms": loaded.max_slip_ms,
        "fast_rejections": sum(1 for x in rej if x <= W7_FAST_MS),
        "rej_p50_ms": percentile(rej, 50),
        "rej_p99_ms": percentile(rej, 99),
        "rej_max_ms": percentile(rej, 100),
        "ok_p50_ms": percentile(ok, 50),
        "ok_p99_ms": percentile(ok, 99),
        "rej_sched_p99_ms": percentile(loaded.latencies_ms(lambda s: s in (429, 503), True), 99),
        "ok_sched_p99_ms": percentile(loaded.latencies_ms(lambda s: 200 <= s < 300, True), 99),
        "connections": loaded.connections,
        "unloaded_p50_ms": percentile(unloaded.latencies_ms(lambda s: s == 200), 50),
        "unloaded_p99_ms": base_p99,
        "unloaded_n": len(unloaded.samples),
        "goodput_rps": len(ok) / loaded.duration_s if loaded.duration_s else math.nan,
        "rss_before_mib": rss0 / 1024,
        "rss_peak_mib": peak / 1024,
        "rss_after_mib": rss1 / 1024,
    }


def w7(ctx: SuiteContext) -> Section:
    overload_s = 3.0 if ctx.quick else 15.0
    unloaded_n = 40 if ctx.quick else 200
    depths = (2,) if ctx.quick else (2, 8)
    rows: list[dict[str, Any]] = []
    for depth in depths:
        row: dict[str, Any] = {"server": "zeroserve", "queue_depth": depth}
        rows.append(row)
        try:
            server = start_zeroserve(
                ctx,
                f"w7-d{depth}",
                [
                    f"sleep={MODELS}:SleepModel?executor=thread&workers=1&queue_depth={depth}"
                    f"&ms={W7_SERVICE_MS:g}"
                ],
            )
        except ServerFailed as exc:
            row["error"] = str(exc)[:300]
            continue
        try:
            row.update(_w7_one(server, "/v1/raw/sleep", overload_s, unloaded_n))
        except OSError as exc:
            row["error"] = f"{type(exc).__name__}: {exc}"
        finally:
            server.stop()
    if fastapi_available():
        row = {"server": "fastapi", "queue_depth": "none"}
        rows.append(row)
        try:
            server = start_fastapi(ctx, "w7-fastapi", sleep_ms=W7_SERVICE_MS)
            try:
                row.update(_w7_one(server, "/v1/raw/sleep", overload_s, unloaded_n))
            finally:
                server.stop()
        except (ServerFailed, OSError) as exc:
            row["error"] = str(exc)[:300]
    save_json(ctx, "W7", rows)
    rate = W7_OVERLOAD * 1000.0 / W7_SERVICE_MS
    lines = [
        "### W7: 10x overload",
        "",
        f"`SleepModel`: `time.sleep({W7_SERVICE_MS / 1000:g})` per request on the thread "
        f"executor, `workers=1`: capacity {1000 / W7_SERVICE_MS:.0f} req/s. An open-loop "
        f"asyncio client sends {rate:.0f} req/s for {overload_s:.0f} s over up to "
        f"{W7_MAX_CONNS} keep-alive connections. Latency: from sending the request on a "
        'connection in hand to the whole response; the "from schedule" column counts from '
        "the request's open-loop scheduled time instead (adds waiting for a connection, "
        "reconnecting, and the client's own lag). Unloaded: {unloaded_n} requests one after another. `queue_depth` counts "
        "queued + running requests, so depth 2 admits one running and one waiting: admitted "
        "latency ≤ 2 service times by construction; depth 8 shows the queueing it allows. "
        "FastAPI: a sync `def` endpoint sleeping under a lock (the same capacity, no "
        f"admission control); requests still open {W7_DRAIN_S:.0f} s after the load window "
        "are counted as unfinished.",
        "",
        "| server | queue depth | sent | 2xx | 429/503 | rejections ≤5 ms | rejection p50 / p99 ms "
        "| admitted p50 / p99 ms | unloaded p50 / p99 ms | admitted p99 ÷ unloaded | from "
        "schedule p99 ms: rejected / admitted | connections opened | unfinished + errors | "
        "RSS before / peak / after MiB |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    targets: list[str] = []
    for r in rows:
        if "sent" not in r:
            lines.append(
                f"| {r['server']} | {r['queue_depth']} | failed: "
                f"{r.get('error', '')[:200]} |||||||||| "
            )
            continue
        ratio = r["ok_p99_ms"] / r["unloaded_p99_ms"] if r["unloaded_p99_ms"] else math.nan
        r["p99_ratio"] = ratio
        fast = r["fast_rejections"] / r["rejected"] if r["rejected"] else math.nan
        lines.append(
            f"| {r['server']} | {r['queue_depth']} | {r['sent']:,} | {r['ok']:,} | "
            f"{r['rejected']:,} ({100 * r['rejected'] / max(1, r['sent']):.0f}%) | "
            f"{fixed(100 * fast, 1)}% | {fixed(r['rej_p50_ms'], 2)} / {fixed(r['rej_p99_ms'], 2)} | "
            f"{fixed(r['ok_p50_ms'])} / {fixed(r['ok_p99_ms'])} | "
            f"{fixed(r['unloaded_p50_ms'])} / {fixed(r['unloaded_p99_ms'])} | {fixed(ratio, 2)}x | "
            f"{fixed(r['rej_sched_p99_ms'])} / {fixed(r['ok_sched_p99_ms'])} | {r['connections']:,} | "
            f"{r['unfinished'] + r['errors'] + r['other_status']} | "
            f"{fixed(r['rss_before_mib'])} / {fixed(r['rss_peak_mib'])} / {fixed(r['rss_after_mib'])} |"
        )
        if r["server"] == "zeroserve":
            flat = r["rss_peak_mib"] - r["rss_before_mib"]
            targets.append(
                f"- zeroserve, depth {r['queue_depth']}: rejections p99 "
                f"{fixed(r['rej_p99_ms'], 2)} ms ≤{W7_FAST_MS:g} ms {mark(r['rej_p99_ms'] <= W7_FAST_MS)}; "
                f"admitted p99 {fixed(ratio, 2)}x unloaded ≤2x {mark(ratio <= 2.0)}; RSS growth "
                f"{fixed(flat)} MiB (flat ≤ 2 MiB: {mark(flat <= 2.0)}); client schedule slip max "
                f"{fixed(r['max_slip_ms'])} ms"
            )
    zs = [r for r in rows if r["server"] == "zeroserve" and "ok_p99_ms" in r]
    fa = [r for r in rows if r["server"] == "fastapi" and "ok_p99_ms" in r]
    if zs and zs[0]["rejected"] and zs[0]["connections"] >= 0.9 * zs[0]["rejected"]:
        targets.append(
            f"- zeroserve closes the connection after each 429 (it answers before "
            f"reading the body): {zs[0]['connections']:,} connections for "
            f"{zs[0]['rejected']:,} rejections, so the client reconnects each time "
            "(the from-schedule column includes it)."
        )
    if zs and fa and fa[0]["ok_p99_ms"] > 0:
        targets.append(
            f"- Same run: zeroserve (depth {zs[0]['queue_depth']}) admitted p99 is "
            f"{zs[0]['ok_p99_ms'] / fa[0]['ok_p99_ms']:.3f}x FastAPI's "
            f"({fixed(zs[0]['ok_p99_ms'])} vs {fixed(fa[0]['ok_p99_ms'])} ms)."
        )
    return Section(GROUP, TITLE, "\n".join([*lines, "", *targets, *footer(ctx)]))
