"""What the API key costs a whole server, in instructions (docs/decisions/0011-api-key-cost.md).

Run: ``.venv/bin/python -m benchmarks.scripts.edge_key_instructions [--json]`` from the
repository root (needs valgrind; ``make bench-tools`` installs it). About three minutes.

The EDGE suite's paired wrk slices cannot resolve a cost of a few percent on a noisy
two-CPU VM (an A/A of two identical servers reads up to ±5 %), and this machine exposes
no hardware counters to ``perf stat``. Instruction counts are exact and repeat to a few
tenths of a percent, so this script counts them: zeroserve serving ``echo`` runs under
valgrind's callgrind, gets W1 64 KiB requests one at a time on one keep-alive connection
(200 to warm up, then the counters are zeroed, then ``--requests``), and the user-space
instructions of the measured requests are read from callgrind's dump. A count still moves
by about ±0.5 % from one server process to the next (each has its own hash seed, so its
dict and set probes differ, and its own memory layout), so each of the three servers is
started ``--starts`` times and the counts are averaged, their range reported beside:

* ``plain``: no key configured, requests without ``Authorization``;
* ``header``: no key configured, requests carry ``Authorization: Bearer …`` (what the
  header alone costs the HTTP layer: parsing, lower-casing, the edge's header scan);
* ``keyed``: one ``--api-key``, requests present it (the key check on top).

Kernel work is not counted; it differs between the three only by the header's 50 bytes on
a 64 KiB request. The EDGE suite reports the counts beside its slices.

Like ``edge_key_cost.py`` it is a measurement script, not a test: it asserts nothing but
that every answer is a 200.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.procs import LOOPBACK, free_port
from benchmarks.servers import ECHO, zeroserve_cmd

DEFAULT_KEY = "sk-zeroserve-bench-0123456789abcdef"
PATH = "/v1/raw/echo"
BODY_BYTES = 64 * 1024
# Requests measured per server: at 130-150 k instructions each, 1,000 take about 15 s under
# callgrind; more would not narrow the spread between processes (above).
DEFAULT_REQUESTS = 1000
# Starts of each server, interleaved (plain, header, keyed, plain, ...): measured here,
# one start's count moved by up to 700 instructions a request between starts, about the
# size of the key check itself, so three starts are averaged.
DEFAULT_STARTS = 3
# Requests before the counters are zeroed: imports, caches and the allocator warm up.
WARMUP_REQUESTS = 200
# Seconds a server under valgrind gets to start listening (it runs ~50x slower).
START_TIMEOUT_S = 180.0
# Seconds for one answer under valgrind, and for the server to exit once told to.
IO_TIMEOUT_S = 30.0
STOP_TIMEOUT_S = 60.0
CASES = ("plain", "header", "keyed")


def request(body: bytes, key: str | None) -> bytes:
    head = (
        f"POST {PATH} HTTP/1.1\r\nHost: {LOOPBACK}\r\n"
        f"Content-Type: application/octet-stream\r\nContent-Length: {len(body)}\r\n"
    )
    if key is not None:
        head += f"Authorization: Bearer {key}\r\n"
    return head.encode() + b"\r\n" + body


def send(port: int, req: bytes, count: int) -> None:
    """``count`` requests, one at a time, on one connection; each answer must be a 200."""
    with socket.create_connection((LOOPBACK, port), timeout=IO_TIMEOUT_S) as sock:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        buf = b""
        for _ in range(count):
            sock.sendall(req)
            while True:
                end = buf.find(b"\r\n\r\n")
                if end >= 0:
                    m = re.search(rb"(?i)\r\ncontent-length: *(\d+)", buf[:end])
                    total = end + 4 + (int(m.group(1)) if m else 0)
                    if len(buf) >= total:
                        if not buf.startswith(b"HTTP/1.1 200"):
                            raise RuntimeError(f"answer was not a 200: {buf[:200]!r}")
                        buf = buf[total:]
                        break
                chunk = sock.recv(1 << 20)
                if not chunk:
                    raise RuntimeError("the server closed the connection")
                buf += chunk


def _wait_listening(port: int, proc: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the server exited with {proc.returncode} while starting")
        with contextlib.suppress(OSError), socket.create_connection((LOOPBACK, port), 1):
            return
        time.sleep(0.2)  # polling a port under valgrind: bounded by the deadline
    raise RuntimeError(f"the server did not listen within {START_TIMEOUT_S:.0f} s")


def _dumped_instructions(out: Path) -> int:
    """The instructions of the dump ``callgrind_control -d`` wrote (not the exit's)."""
    for part in sorted(out.parent.glob(out.name + ".*")):
        text = part.read_text(errors="replace")
        if "Trigger: Client Request" in text or "Trigger: dump" in text:
            m = re.search(r"^(?:summary|totals): (\d+)", text, re.M)
            if m:
                return int(m.group(1))
    raise RuntimeError(f"no callgrind dump next to {out}")


def count(case: str, key: str, requests: int, work: Path) -> float:
    """User-space instructions per request for one of :data:`CASES`."""
    port = free_port()
    out = work / f"callgrind-{case}.out"
    argv = [
        "valgrind",
        "--tool=callgrind",
        f"--callgrind-out-file={out}",
        *zeroserve_cmd(),
        "serve",
        "--host",
        LOOPBACK,
        "--port",
        str(port),
        "--model",
        ECHO,
    ]
    if case == "keyed":
        argv += ["--api-key", key]
    env = {k: v for k, v in os.environ.items() if k != "ZEROSERVE_API_KEY"}
    log = (work / f"{case}.log").open("wb")
    # A session of its own: the server and valgrind are stopped by this group, and only it.
    proc = subprocess.Popen(
        argv, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True
    )
    try:
        _wait_listening(port, proc)
        req = request(os.urandom(BODY_BYTES), None if case == "plain" else key)
        send(port, req, WARMUP_REQUESTS)
        subprocess.run(["callgrind_control", "-z", str(proc.pid)], check=True, capture_output=True)
        send(port, req, requests)
        subprocess.run(["callgrind_control", "-d", str(proc.pid)], check=True, capture_output=True)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGINT)
        try:
            proc.wait(timeout=STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        log.close()
    return _dumped_instructions(out) / requests


def measure(key: str, requests: int, starts: int) -> dict[str, float]:
    """Per case the mean over ``starts`` starts (``CASE``), and the lowest and highest
    start (``CASE_low``, ``CASE_high``)."""
    counts: dict[str, list[float]] = {c: [] for c in CASES}
    with tempfile.TemporaryDirectory(prefix="zs-key-instr-") as tmp:
        for start in range(starts):
            for case in CASES:
                work = Path(tmp) / f"{case}-{start}"
                work.mkdir()
                counts[case].append(count(case, key, requests, work))
    got: dict[str, float] = {"requests": requests, "starts": starts}
    for case, values in counts.items():
        got[case] = sum(values) / len(values)
        got[f"{case}_low"], got[f"{case}_high"] = min(values), max(values)
    return got


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--key", default=DEFAULT_KEY, help="the configured (and presented) key")
    p.add_argument(
        "--requests", type=int, default=DEFAULT_REQUESTS, help="requests measured per start"
    )
    p.add_argument("--starts", type=int, default=DEFAULT_STARTS, help="starts of each server")
    p.add_argument("--json", action="store_true", help="print one JSON line")
    args = p.parse_args(argv)
    if shutil.which("valgrind") is None or shutil.which("callgrind_control") is None:
        print("valgrind is not installed (make bench-tools)", file=sys.stderr)
        return 2
    got = measure(args.key, args.requests, args.starts)
    if args.json:
        print(json.dumps(got))
    else:
        plain, header, keyed = got["plain"], got["header"], got["keyed"]
        print(
            f"instructions per W1 64 KiB request (mean of {args.starts} starts x "
            f"{args.requests:,} requests each): "
            f"{plain:,.0f} plain, {header:,.0f} with the header (+{header - plain:,.0f}), "
            f"{keyed:,.0f} with the key checked (+{keyed - header:,.0f}); the key in all "
            f"+{keyed - plain:,.0f}, {100 * (keyed - plain) / plain:.2f}% of the plain request's"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
