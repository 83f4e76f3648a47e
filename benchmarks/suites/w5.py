"""W5: a 1 KiB/s reader on a stream the model could produce at 100 MiB: RSS stays bounded."""

from __future__ import annotations

import math
import socket
import struct
import time
from typing import Any

from ..context import SuiteContext
from ..procs import LOOPBACK, ServerFailed, ServerProcess, http_get
from ..report import Section, fixed, footer, mark
from ._runtime import (
    GROUP,
    IO_TIMEOUT_S,
    MODELS,
    RECV,
    TITLE,
    KiB,
    metrics,
    raw_request,
    save_json,
    start_zeroserve,
)

# W5: the reader takes 1 KiB then sleeps 1 s; its receive buffer is kept small so the
# kernel does not absorb the stream for it.
W5_READ_BYTES = 1 * KiB

W5_SLEEP_S = 1.0

W5_RCVBUF = 4 * KiB

W5_TARGET_MIB = 16.0


def _slow_reader(server: ServerProcess, path: str, seconds: float) -> dict[str, Any]:
    """Read 1 KiB, sleep 1 s, for ``seconds``; sample /metrics after each read."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, W5_RCVBUF)
    sock.settimeout(IO_TIMEOUT_S)
    got, ended, error = 0, False, ""
    peak: dict[str, float] = {}
    last: dict[str, float] = {}
    try:
        sock.connect((LOOPBACK, server.port))
        sock.sendall(raw_request("POST", path))
        deadline = time.monotonic() + seconds
        for _ in range(int(seconds / W5_SLEEP_S) + 2):
            if time.monotonic() >= deadline:
                break
            data = sock.recv(W5_READ_BYTES)
            if not data:
                ended = True
                break
            got += len(data)
            last = metrics(server.port)
            for k, v in last.items():
                if k.startswith(("zeroserve_channels_", "zeroserve_arena_used")):
                    peak[k] = max(peak.get(k, v), v)
            time.sleep(W5_SLEEP_S)
    except OSError as exc:
        error = f"{type(exc).__name__}: {exc}"
    finally:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        sock.close()
    return {
        "read_bytes": got,
        "ended_by_server": ended,
        "error": error,
        "metrics_peak": peak,
        "channels_open_last": last.get("zeroserve_channels_open", math.nan),
    }


def w5(ctx: SuiteContext) -> Section:
    seconds = 3.0 if ctx.quick else 15.0
    executors = ("thread",) if ctx.quick else ("inline", "thread", "process")
    rows: list[dict[str, Any]] = []
    for ex in executors:
        for policy in ("block", "coalesce"):
            row: dict[str, Any] = {"executor": ex, "policy": policy}
            rows.append(row)
            try:
                server = start_zeroserve(
                    ctx, f"w5-{ex}-{policy}", [f"flood={MODELS}:FloodModel?executor={ex}"]
                )
            except ServerFailed as exc:
                row["error"] = str(exc)[:300]
                continue
            try:
                # One short stream first, so lazily allocated buffers are in the baseline.
                http_get(server.port, "/metrics")
                _warm = socket.create_connection((LOOPBACK, server.port), timeout=IO_TIMEOUT_S)
                with _warm:
                    _warm.sendall(raw_request("POST", "/v1/raw/flood?stream=1&max_tokens=16"))
                    tail = b""
                    for _ in range(10_000):  # 16 x 64 KiB, chunked, ends with 0\r\n\r\n
                        data = _warm.recv(RECV)
                        tail = (tail + data)[-16:]
                        if not data or tail.endswith(b"0\r\n\r\n"):
                            break
                time.sleep(0.3)
                before = server.usage().rss_kib
                server.start_sampling()
                try:
                    res = _slow_reader(server, f"/v1/raw/flood?stream=1&policy={policy}", seconds)
                finally:
                    peak = server.stop_sampling()
                time.sleep(0.5)
                after_metrics = metrics(server.port)
                row.update(res)
                row["rss_before_mib"] = before / 1024
                row["rss_growth_mib"] = max(0, peak - before) / 1024
                row["channels_open_after"] = after_metrics.get("zeroserve_channels_open", math.nan)
                row["alive"] = server.alive()
            except OSError as exc:
                row["error"] = f"{type(exc).__name__}: {exc}"
            finally:
                server.stop()
    save_json(ctx, "W5", rows)
    lines = [
        "### W5: a 1 KiB/s reader on a stream the model could produce at 100 MiB",
        "",
        f"`FloodModel` yields 64 KiB pieces up to 100 MiB; one client reads {W5_READ_BYTES} B "
        f"then sleeps {W5_SLEEP_S:.0f} s (SO_RCVBUF {W5_RCVBUF // KiB} KiB) for {seconds:.0f} s. "
        "RSS growth = peak RSS of the server's process tree while reading - RSS before "
        "(sampled every 0.1 s). Channel columns: peaks of the `zeroserve_channels_*` gauges "
        "sampled once per read (the peak gauge includes a 16-piece warm-up stream). Stream: "
        "whether the server still had the stream's channel open at the last read.",
        "",
        "| executor | policy | RSS before MiB | RSS growth MiB | read by client | "
        "channels pending B (peak) | channel peak B | coalesced | stream | target ≤16 MiB |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        if "rss_growth_mib" not in r:
            lines.append(
                f"| {r['executor']} | {r['policy']} | failed: {r.get('error', '')} "
                "| | | | | | | missed |"
            )
            continue
        mp = r["metrics_peak"]
        # The client still has the socket buffers' bytes to read when the server aborts a
        # coalesce stream, so the server's open-channel gauge tells, not the client.
        outcome = (
            "aborted by server"
            if r["ended_by_server"] or r["channels_open_last"] == 0
            else "streaming at the end"
        )
        if r["error"]:
            outcome = r["error"][:60]
        lines.append(
            f"| {r['executor']} | {r['policy']} | {fixed(r['rss_before_mib'])} | "
            f"{fixed(r['rss_growth_mib'], 2)} | {r['read_bytes']:,} B | "
            f"{fixed(mp.get('zeroserve_channels_pending_bytes', math.nan), 0)} | "
            f"{fixed(mp.get('zeroserve_channels_peak_pending_bytes', math.nan), 0)} | "
            f"{fixed(mp.get('zeroserve_channels_coalesced', math.nan), 0)} | {outcome} | "
            f"{mark(r['rss_growth_mib'] <= W5_TARGET_MIB)} |"
        )
    notes = [
        "`coalesce` aborts a stream whose client falls more than its byte cap (1 MiB) "
        'behind: "aborted by server" there is the policy working, not a failure.'
    ]
    return Section(GROUP, TITLE, "\n".join(lines + footer(ctx, notes=notes)))
