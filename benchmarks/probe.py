"""First-event probe: how long a NEW client waits for its first SSE event under load.

Runs as its own process (``python -m benchmarks.probe``), pinned next to the load
generator, while the main load runs. Each sample opens a fresh TCP connection, sends the
streaming request, and times from ``connect()`` to the first ``data:`` byte of the body;
then it closes the connection (the server sees a client disconnect). Samples are
sequential with a short pause, bounded in count and in time. Output: one JSON line, with
the priority the probe ran at.

The probe raises itself to real-time priority where permitted (``machine.probe_priority``),
as the /health probe does: it shares the load CPU with wrk, and at equal priority a
wake-up of the probe can wait for wrk's time slice, which would be counted as the
server's latency. Measured (W2 raw SSE into zeroserve, 6 interleaved rounds each): at 32
streams, where wrk leaves the load CPU partly idle, it changed nothing beyond the noise
(p50 5.8 against 6.0 ms, p99 24 against 25 ms); at 256, where wrk keeps that CPU busy,
p50 51 against 58 ms with more samples in the window. Sequential samples 20 ms apart
cannot starve wrk.
"""

from __future__ import annotations

import argparse
import json
import socket
import sys
import time
from pathlib import Path

from .machine import probe_priority
from .procs import LOOPBACK

# Pause between samples, so the probe itself adds little load to the server.
PROBE_INTERVAL_S = 0.02
# One sample may wait at most this long; slower counts as a timeout, not a number.
PROBE_TIMEOUT_S = 10.0
PROBE_MAX_SAMPLES = 10_000
# The priority words of a probe told to stay at normal priority (``--no-realtime``).
NOT_RAISED = "normal priority (real-time not asked for)"
_RECV = 65536


def build_request(path: str, body: bytes, headers: dict[str, str]) -> bytes:
    head = [f"POST {path} HTTP/1.1", f"Host: {LOOPBACK}", f"Content-Length: {len(body)}"]
    head += [f"{k}: {v}" for k, v in headers.items()]
    return ("\r\n".join(head) + "\r\n\r\n").encode("latin-1") + body


def first_event_s(port: int, request: bytes, timeout_s: float = PROBE_TIMEOUT_S) -> float:
    """Seconds from connect to the first ``data:`` of the response body."""
    t0 = time.perf_counter()
    with socket.create_connection((LOOPBACK, port), timeout=timeout_s) as sock:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.sendall(request)
        buf = bytearray()
        head_end = -1
        while True:
            chunk = sock.recv(_RECV)
            if not chunk:
                raise ConnectionError("server closed before the first event")
            buf += chunk
            if head_end < 0:
                head_end = buf.find(b"\r\n\r\n")
                if head_end < 0:
                    continue
                status = buf[: buf.find(b"\r\n")].split()[1]
                if status != b"200":
                    raise ConnectionError(f"status {status.decode()}")
            if buf.find(b"data:", head_end) >= 0:
                return time.perf_counter() - t0


def run_probe(
    port: int, request: bytes, duration_s: float, interval_s: float = PROBE_INTERVAL_S
) -> dict[str, object]:
    samples: list[float] = []
    failures: list[str] = []
    deadline = time.monotonic() + duration_s
    while time.monotonic() < deadline and len(samples) + len(failures) < PROBE_MAX_SAMPLES:
        try:
            samples.append(first_event_s(port, request) * 1000)
        except OSError as exc:
            failures.append(f"{type(exc).__name__}: {exc}")
        time.sleep(interval_s)
    return {"samples_ms": samples, "failures": len(failures), "failure_examples": failures[:3]}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--path", required=True)
    p.add_argument("--body-file", type=Path, required=True)
    p.add_argument("--header", action="append", default=[], help="Name: value")
    p.add_argument("--duration", type=float, required=True)
    p.add_argument("--delay", type=float, default=0.0, help="wait before the first sample")
    p.add_argument(
        "--no-realtime",
        action="store_true",
        help="stay at normal priority (to measure what real-time changes)",
    )
    args = p.parse_args(argv)
    priority = NOT_RAISED if args.no_realtime else probe_priority()
    headers = dict(h.split(": ", 1) for h in args.header)
    request = build_request(args.path, args.body_file.read_bytes(), headers)
    time.sleep(args.delay)
    json.dump({**run_probe(args.port, request, args.duration), "priority": priority}, sys.stdout)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
