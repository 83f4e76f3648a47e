"""W6: the client disconnects mid-generation; the model must stop."""

from __future__ import annotations

import math
import socket
import struct
import time
from typing import Any

from ..context import SuiteContext
from ..models import create_counter, read_counter
from ..procs import LOOPBACK, ServerFailed
from ..report import Section, fixed, footer, mark
from ..servers import importable
from ..stats import percentile
from ._runtime import (
    GROUP,
    IO_TIMEOUT_S,
    MODELS,
    RECV,
    TITLE,
    metrics,
    raw_request,
    save_json,
    start_zeroserve,
)

# W6: events read before the disconnect; the model ticks every 1 ms.
W6_EVENTS = 20

W6_TARGET_MS = 50.0

W6_SETTLE_S = 0.2  # the counter must stay unchanged this long to count as stopped

W6_STOP_WAIT_S = 3.0  # past this the model counts as never stopped

# Always measured; ``ray`` (actors on this node, through their link) too in full runs
# where Ray is installed: each start brings up a local Ray, too slow for --quick.
W6_EXECUTORS = ("inline", "thread", "process")


def _w6_trial(port: int, model: str, counter: str) -> dict[str, Any]:
    sock = socket.create_connection((LOOPBACK, port), timeout=IO_TIMEOUT_S)
    try:
        sock.sendall(raw_request("POST", f"/v1/raw/{model}?stream=1"))
        seen, carry = 0, b""
        deadline = time.monotonic() + IO_TIMEOUT_S
        while seen < W6_EVENTS and time.monotonic() < deadline:
            data = sock.recv(RECV)
            if not data:
                raise ConnectionError("stream ended before the disconnect")
            seen += (carry + data).count(b"tick")
            carry = data[-3:]  # a "tick" split across reads is counted once
        count0, _ = read_counter(counter)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        t_disc = time.monotonic()
    finally:
        sock.close()  # RST: SO_LINGER 0
    last = (count0, 0.0)
    stable_since = time.monotonic()
    end = t_disc + W6_STOP_WAIT_S
    while time.monotonic() < end:
        cur = read_counter(counter)
        if cur[0] != last[0]:
            last, stable_since = cur, time.monotonic()
        elif time.monotonic() - stable_since >= W6_SETTLE_S:
            break
        time.sleep(0.002)
    count, last_t = read_counter(counter)
    stopped = time.monotonic() - stable_since >= W6_SETTLE_S
    return {
        "stop_ms": (last_t - t_disc) * 1000 if stopped else math.inf,
        "pieces_after": count - count0,
        "stopped": stopped,
    }


def w6(ctx: SuiteContext) -> Section:
    trials = 5 if ctx.quick else 20
    with_ray = not ctx.quick and importable("ray")() is None
    executors = (*W6_EXECUTORS, *(("ray",) if with_ray else ()))
    work = ctx.results_dir / "work"
    work.mkdir(parents=True, exist_ok=True)
    rows: list[dict[str, Any]] = []
    for ex in executors:
        counter = str((work / f"w6-{ex}.counter").resolve())
        create_counter(counter)
        cls = "AsyncTickerModel" if ex == "inline" else "TickerModel"
        row: dict[str, Any] = {"executor": ex, "model": cls, "trials": []}
        rows.append(row)
        try:
            server = start_zeroserve(
                ctx, f"w6-{ex}", [f"tick={MODELS}:{cls}?executor={ex}&counter={counter}"]
            )
        except ServerFailed as exc:
            row["error"] = str(exc)[:300]
            continue
        try:
            for _ in range(trials):
                row["trials"].append(_w6_trial(server.port, "tick", counter))
            time.sleep(0.2)
            m = metrics(server.port)
            row["channels_open_after"] = m.get("zeroserve_channels_open", math.nan)
            row["in_flight_after"] = m.get('zeroserve_queue_in_flight{name="tick"}', math.nan)
        except OSError as exc:
            row["error"] = f"{type(exc).__name__}: {exc}"
        finally:
            server.stop()
    save_json(ctx, "W6", rows)
    lines = [
        "### W6: client disconnect mid-generation → the model stops",
        "",
        f"The ticker model yields a piece every 1 ms and writes its produced count and a "
        f"CLOCK_MONOTONIC timestamp into a shared file after each piece. The client reads "
        f"{W6_EVENTS} pieces, then resets the connection (SO_LINGER 0). Stop time = the "
        f"model's last piece - the disconnect (≤0: it had already stopped); the counter must "
        f"then stay unchanged {W6_SETTLE_S * 1000:.0f} ms. {trials} trials per executor "
        "(inline: an async generator; thread/process/ray: a sync generator with `time.sleep`; "
        "ray: one actor on this node, started by the server's own local Ray, in full runs "
        "where Ray is installed).",
        "",
        "| executor | trials | stop p50 ms | stop max ms | pieces after disconnect (max) "
        "| never stopped | in flight after | target ≤50 ms |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        ts = r["trials"]
        if not ts:
            lines.append(f"| {r['executor']} | 0 | failed: {r.get('error', '')} | | | | | missed |")
            continue
        stops = [t["stop_ms"] for t in ts]
        finite = [s for s in stops if math.isfinite(s)]
        never = len(stops) - len(finite)
        worst = max(stops)
        lines.append(
            f"| {r['executor']} | {len(ts)} | {fixed(percentile(finite, 50), 2)} | "
            f"{'never' if never else fixed(worst, 2)} | {max(t['pieces_after'] for t in ts)} | "
            f"{never} | {fixed(r.get('in_flight_after', math.nan), 0)} | "
            f"{mark(not never and worst <= W6_TARGET_MS and not r.get('error'))} |"
        )
    return Section(GROUP, TITLE, "\n".join(lines + footer(ctx)))
