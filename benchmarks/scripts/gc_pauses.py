"""The cyclic GC's pauses on the server's loop under W2 raw SSE x32 (docs/decisions/
0010-memory-between-requests.md).

Run: ``.venv/bin/python -m benchmarks.scripts.gc_pauses [--seconds 10] [--json]`` from the
repository root; with ``ZSBENCH_BASELINE_SRC=/other/checkout/src`` set it measures that
tree too, alternating (subject, baseline, subject, ...) for ``--rounds`` rounds. Each
measurement starts a fresh zeroserve (the benchmark's echo model, pinned to the server
CPU) whose interpreter records every collection through ``gc.callbacks``, loads it with
W2's raw SSE x32 for the warm-up and then ``--seconds`` (wrk, pinned to the load CPU),
and stops it with SIGTERM; the server writes what it recorded at exit. Printed per
server: collections and their total and longest pause per generation, the GC's share of
the server's CPU, and the tokens/s of the measured stretch.

The harness itself never looks inside a server; this script does, through an
interpreter hook, which is why it is a script of its own.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from pathlib import Path

from .. import wrk
from ..context import Settings
from ..machine import Pinning, harness_on_load_cpu
from ..procs import ServerProcess
from ..runner import prepare
from ..scenarios import Case, cases_for
from ..servers import ECHO, Server, at_baseline, start, zeroserve, zeroserve_cmd

RESULTS = Path("bench-results/gc_pauses")
CASE = "W2-sse-c32"
WARMUP_S = 3
# The server's own interpreter: every collection's generation and duration, written as
# one JSON object to the file named by ZSBENCH_GC_OUT when the process exits (the
# server exits through SIGTERM's drain, so atexit runs). Only the measured stretch
# counts: the harness writes its start and end (epoch seconds) to ZSBENCH_GC_MARK.
CHILD = """
import atexit, gc, json, os, sys, time
out, mark = os.environ["ZSBENCH_GC_OUT"], os.environ["ZSBENCH_GC_MARK"]
seen, began = [], [0.0]
def hook(phase, info):
    if phase == "start":
        began[0] = time.perf_counter()
    else:
        seen.append((time.time(), info["generation"], time.perf_counter() - began[0]))
gc.callbacks.append(hook)
def dump():
    try:
        start, stop = (float(x) for x in open(mark).read().split())
    except (OSError, ValueError):
        start, stop = 0.0, 0.0
    picked = [(g, d) for t, g, d in seen if start <= t <= stop]
    json.dump({"collections": picked, "seconds": stop - start}, open(out, "w"))
atexit.register(dump)
from zeroserve.cli import main
sys.exit(main(sys.argv[1:]))
"""


@dataclasses.dataclass
class Pauses:
    server: str
    seconds: float
    tokens_per_s: float
    cpu_s: float
    count: list[int]  # per generation 0, 1, 2
    total_ms: list[float]
    max_ms: list[float]

    @property
    def share(self) -> float:
        """The collections' share of the server's CPU in the measured stretch."""
        return sum(self.total_ms) / 1e3 / self.cpu_s if self.cpu_s else 0.0


def gc_server(base: Server) -> Server:
    """``base`` (a zeroserve) with the GC-recording interpreter in front of its CLI."""

    def argv(port: int, up: int | None, work: Path) -> list[str]:
        args = base.argv(port, up, work)
        assert args[: len(zeroserve_cmd())] == zeroserve_cmd()
        return [sys.executable, "-c", CHILD, *args[len(zeroserve_cmd()) :]]

    return dataclasses.replace(base, argv=argv)


def measure(srv: Server, case: Case, settings: Settings) -> Pauses:
    pins, work, seconds = settings.pins, settings.results_dir, settings.duration_s
    out, mark = work / f"{srv.name}.gc.json", work / f"{srv.name}.gc.mark"
    for p in (out, mark):
        p.unlink(missing_ok=True)
    env = {"ZSBENCH_GC_OUT": str(out), "ZSBENCH_GC_MARK": str(mark)}
    _, script = prepare(case, settings)
    proc: ServerProcess = start(_with_env(srv, env), pins, work)
    try:
        wrk.run(script, proc.port, case.path, case.connections, settings.warmup_s, pins.load_cpu)
        cpu0, t0 = proc.usage().cpu_s, time.time()
        res = wrk.run(script, proc.port, case.path, case.connections, seconds, pins.load_cpu)
        cpu1, t1 = proc.usage().cpu_s, time.time()
        mark.write_text(f"{t0} {t1}")
    finally:
        proc.stop()
    data = json.loads(out.read_text())
    count, total, longest = [0, 0, 0], [0.0, 0.0, 0.0], [0.0, 0.0, 0.0]
    for gen, dur in data["collections"]:
        count[gen] += 1
        total[gen] += dur * 1e3
        longest[gen] = max(longest[gen], dur * 1e3)
    return Pauses(
        srv.name,
        t1 - t0,
        res.good * case.events_per_request / (t1 - t0),
        cpu1 - cpu0,
        count,
        total,
        longest,
    )


def _row(r: Pauses) -> str:
    return (
        f"| {r.server} | {r.tokens_per_s:,.0f} "
        f"| {r.count[0]} / {r.total_ms[0]:.0f} | {r.count[1]} / {r.total_ms[1]:.0f} "
        f"| {r.count[2]} / {r.total_ms[2]:.0f} ({r.max_ms[2]:.1f}) "
        f"| {r.share * 100:.1f} |"
    )


def _with_env(srv: Server, env: dict[str, str]) -> Server:
    extra = srv.env

    def merged(port: int) -> dict[str, str]:
        return {**env, **(extra(port) if extra else {})}

    return dataclasses.replace(srv, env=merged)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seconds", type=int, default=10, help="measured load per server")
    p.add_argument("--rounds", type=int, default=1, help="alternating rounds")
    p.add_argument("--json", action="store_true", help="one JSON line per measurement")
    args = p.parse_args()
    settings = Settings(
        rounds=max(1, args.rounds),
        duration_s=args.seconds,
        warmup_s=WARMUP_S,
        results_dir=RESULTS.resolve(),
        pins=Pinning.detect(),
    )
    settings.results_dir.mkdir(parents=True, exist_ok=True)
    (case,) = [c for c in cases_for(["W2"], quick=False) if c.key == CASE]
    subject = zeroserve(extra=("--model", ECHO))
    base = at_baseline(gc_server(subject), "zeroserve-base", "zeroserve@base")
    servers = [gc_server(subject), *([base] if base is not None else [])]
    print("| server | tokens/s | gen0 n / ms | gen1 n / ms | gen2 n / ms (longest) | GC % of CPU |")
    print("|---|--:|--:|--:|--:|--:|")
    with harness_on_load_cpu(settings.pins):
        for _ in range(settings.rounds):
            for srv in servers:
                r = measure(srv, case, settings)
                if args.json:
                    print(json.dumps(dataclasses.asdict(r) | {"share": r.share}), flush=True)
                else:
                    print(_row(r), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
