"""One measurement: a fresh server, a checked request, warm-up, then load under accounting.

For each (case, server, round) the runner starts the server pinned to the server CPU,
validates one request, warms up, snapshots CPU time (and /metrics for zeroserve), runs wrk
pinned to the load CPU for the duration (plus the first-event probe for streams), then
snapshots again and stops the server. Everything it starts it stops, by PID.
"""

from __future__ import annotations

import contextlib
import json
import math
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from . import wrk
from .context import Settings
from .machine import pin_prefix
from .procs import ServerFailed, ServerProcess, http_get, http_post
from .scenarios import Case
from .servers import Server, started
from .stats import median, percentile

# strace write counting: a short run at low concurrency so partial streams at the edges
# of the window are few; strace slows the server, so only the counts are used.
STRACE_S = 2
STRACE_CONNECTIONS = 4
WRITE_SYSCALLS = ("write", "writev", "sendmsg", "sendto")
PROBE_SLACK_S = 15.0

_METRIC_LINE = re.compile(
    r"^(zeroserve_copied_bytes_total|zeroserve_payload_bytes_total)"
    r'\{(\w+)="([^"]*)"\}\s+(\S+)',
    re.M,
)


@dataclass
class RunResult:
    server: str
    case: str
    round: int
    ok: bool
    error: str = ""
    requests: int = 0  # completed with 2xx/3xx
    responses: int = 0  # completed, any status
    duration_s: float = 0.0
    rps: float = math.nan
    events_per_s: float = math.nan
    latency_pct_ms: dict[float, float] = field(default_factory=dict)
    wrk_errors: int = 0
    bytes_per_request: float = math.nan
    cpu_ms_per_request: float = math.nan
    idle_rss_mib: float = math.nan
    peak_rss_mib: float = math.nan
    rss_per_stream_kib: float = math.nan
    first_event_ms: list[float] = field(default_factory=list)
    probe_failures: int = 0
    probe_priority: str = ""  # the first-event probe's, in machine.probe_priority's words
    writes_per_stream: float = math.nan
    copied: dict[str, float] = field(default_factory=dict)
    payload: dict[str, float] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items()}


def scrape(port: int, tls: bool = False) -> tuple[dict[str, float], dict[str, float]]:
    """(copied bytes by site, payload bytes by direction) from /metrics."""
    status, text = http_get(port, "/metrics", tls=tls)
    copied: dict[str, float] = {}
    payload: dict[str, float] = {}
    if status != 200:
        return copied, payload
    for name, _label, value, num in _METRIC_LINE.findall(text.decode("utf-8", "replace")):
        (copied if name.startswith("zeroserve_copied") else payload)[value] = float(num)
    return copied, payload


def _delta(after: dict[str, float], before: dict[str, float]) -> dict[str, float]:
    return {k: v - before.get(k, 0.0) for k, v in after.items()}


def prepare(case: Case, settings: Settings, delay_ms: int = 0) -> tuple[Path, Path]:
    """Write the case's body file and wrk script once; return (body, script) paths."""
    work = settings.work
    body = work / f"{case.key}.body"
    if not body.exists() or body.read_bytes() != case.body:
        body.write_bytes(case.body)
    script = wrk.write_script(work / f"{case.key}.lua", body, case.headers, delay_ms)
    return body, script


def _start_probe(case: Case, port: int, body: Path, settings: Settings) -> subprocess.Popen[str]:
    argv = [
        *pin_prefix(settings.pins.load_cpu),
        sys.executable,
        "-m",
        "benchmarks.probe",
        "--port",
        str(port),
        "--path",
        case.path,
        "--body-file",
        str(body),
        "--duration",
        str(max(0.5, max(settings.duration_s, case.min_duration_s) - 0.5)),
        "--delay",
        "0.25",
    ]
    for k, v in case.headers.items():
        argv += ["--header", f"{k}: {v}"]
    return subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _finish_probe(proc: subprocess.Popen[str], result: RunResult) -> None:
    try:
        out, err = proc.communicate(timeout=PROBE_SLACK_S)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        result.error = "first-event probe timed out"
        return
    try:
        data = json.loads(out.strip().splitlines()[-1])
    except (IndexError, json.JSONDecodeError):
        result.error = f"first-event probe failed: {err[-500:]}"
        return
    result.first_event_ms = [float(x) for x in data["samples_ms"]]
    result.probe_failures = int(data["failures"])
    result.probe_priority = str(data.get("priority", ""))


def count_writes(server: ServerProcess, case: Case, script: Path, settings: Settings) -> float:
    """Write syscalls per stream: strace -c on the server during a short wrk run."""
    if shutil.which("strace") is None:
        return math.nan
    out = settings.work / f"strace-{server.name}-{case.key}.txt"
    argv = ["strace", "-c", "-f", "-e", "trace=" + ",".join(WRITE_SYSCALLS), "-o", str(out)]
    for pid in server.tree():  # every process of the server (granian writes from a worker)
        argv += ["-p", str(pid)]
    tracer = subprocess.Popen(
        [*pin_prefix(settings.pins.load_cpu), *argv],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        time.sleep(0.5)  # attach
        res = wrk.run(
            script,
            server.port,
            case.path,
            STRACE_CONNECTIONS,
            STRACE_S,
            settings.pins.load_cpu,
            tls=server.tls,
        )
    finally:
        with contextlib.suppress(ProcessLookupError):
            tracer.send_signal(signal.SIGINT)
        try:
            tracer.wait(timeout=10)
        except subprocess.TimeoutExpired:
            tracer.kill()
            tracer.wait()
    calls = 0
    with contextlib.suppress(OSError):
        for line in out.read_text().splitlines():
            parts = line.split()
            if parts and parts[-1] in WRITE_SYSCALLS:
                # "% time  seconds  usecs/call  calls  [errors]  syscall"
                nums = [p for p in parts[:-1] if p.replace(".", "").isdigit()]
                if len(nums) >= 4:
                    calls += int(nums[3])
    return calls / res.requests if res.requests and calls else math.nan


def check_request(port: int, case: Case, tls: bool) -> str | None:
    """Send the case's request once and judge the answer with its validator.

    Returns:
        None when the server answered right, else what was wrong (the server does not
        support the case).
    """
    status, headers, resp = http_post(port, case.path, case.body, case.headers, tls=tls)
    return case.validate(status, headers, resp)


def record(result: RunResult, res: wrk.WrkResult, case: Case, cpu_s: float) -> None:
    """Fill ``result`` from one wrk run: throughput, latency, errors, and CPU per request
    from ``cpu_s``, the server's CPU seconds over that run."""
    result.requests = res.good
    result.responses = res.requests
    result.duration_s = res.duration_s
    result.rps = res.rps
    result.events_per_s = res.rps * case.events_per_request
    result.latency_pct_ms = res.latency_pct_ms
    result.wrk_errors = res.error_count
    result.bytes_per_request = res.bytes / res.requests if res.requests else math.nan
    result.cpu_ms_per_request = cpu_s * 1000 / res.good if res.good else math.nan


def measure(srv: Server, case: Case, rnd: int, settings: Settings, delay_ms: int = 0) -> RunResult:
    """One fresh server (and upstream), one checked request, warm-up, then wrk for the
    duration under CPU, RSS and /metrics accounting; ``delay_ms`` is a pause after every
    answer on each wrk connection (a closed-loop rate)."""
    result = RunResult(server=srv.name, case=case.key, round=rnd, ok=False)
    body_path, script = prepare(case, settings, delay_ms)
    load_cpu = settings.pins.load_cpu
    try:
        with started(srv, settings.pins, settings.results_dir) as server:
            _measure(srv, server, case, rnd, settings, body_path, script, load_cpu, result)
    except ServerFailed as exc:
        result.error = f"start failed: {exc}"
    except (OSError, RuntimeError, subprocess.SubprocessError, ValueError) as exc:
        result.error = f"{type(exc).__name__}: {exc}"
    return result


def _measure(
    srv: Server,
    server: ServerProcess,
    case: Case,
    rnd: int,
    settings: Settings,
    body_path: Path,
    script: Path,
    load_cpu: int | None,
    result: RunResult,
) -> None:
    port, tls = server.port, srv.tls
    problem = check_request(port, case, tls)
    if problem is not None:
        result.error = f"unsupported: {problem}"
        return
    # Before warm-up: RSS per stream is measured against the server at rest.
    result.idle_rss_mib = server.usage().rss_kib / 1024
    if settings.warmup_s > 0:
        wrk.run(script, port, case.path, case.connections, settings.warmup_s, load_cpu, tls)
    before = scrape(port, tls) if srv.scrape_metrics else ({}, {})
    if case.probe_first_event and tls:
        raise ValueError("the first-event probe speaks plain HTTP only")
    probe = _start_probe(case, port, body_path, settings) if case.probe_first_event else None
    u0 = server.usage()
    server.start_sampling()
    try:
        res = wrk.run(
            script,
            port,
            case.path,
            case.connections,
            max(settings.duration_s, case.min_duration_s),
            load_cpu,
            tls,
        )
    finally:
        peak_kib = server.stop_sampling()
        u1 = server.usage()
        if probe is not None:
            _finish_probe(probe, result)
    if srv.scrape_metrics:
        after = scrape(port, tls)
        result.copied = _delta(after[0], before[0])
        result.payload = _delta(after[1], before[1])
    record(result, res, case, u1.cpu_s - u0.cpu_s)
    result.peak_rss_mib = max(peak_kib, u1.hwm_kib) / 1024
    if case.kind == "stream":
        result.rss_per_stream_kib = (
            (peak_kib / 1024 - result.idle_rss_mib) * 1024 / case.connections
        )
    if case.count_writes and settings.count_writes and rnd == 0:
        result.writes_per_stream = count_writes(server, case, script, settings)
    if not server.alive():
        result.error = f"server died: {server.log_tail()}"
        return
    result.ok = res.good > 0
    if not result.ok:
        result.error = (
            "no request completed"
            if not res.requests
            else f"all {res.requests} responses were errors (non-2xx)"
        )


# -- the grid: every run of a suite ---------------------------------------------------------


@dataclass
class Grid:
    """Every run of a suite: (case key, server name) -> runs, and why servers were skipped.
    Medians over rounds; ratios are medians of per-round ratios (each round's pair ran
    back to back, so drift in background load cancels)."""

    runs: dict[tuple[str, str], list[RunResult]] = field(default_factory=dict)
    skipped: dict[str, str] = field(default_factory=dict)

    def add(self, r: RunResult) -> None:
        self.runs.setdefault((r.case, r.server), []).append(r)

    def has(self, case: str, server: str) -> bool:
        return (case, server) in self.runs

    def ok(self, case: str, server: str) -> list[RunResult]:
        return [r for r in self.runs.get((case, server), []) if r.ok]

    def med(self, case: str, server: str, get: Callable[[RunResult], float]) -> float:
        return median(get(r) for r in self.ok(case, server))

    def ratio(
        self,
        case: str,
        a: str,
        b: str,
        get: Callable[[RunResult], float],
        case_b: str | None = None,
    ) -> float:
        """Median over rounds of a/b, pairing runs of the same round."""
        return median(self.ratios(case, a, b, get, case_b))

    def ratios(
        self,
        case: str,
        a: str,
        b: str,
        get: Callable[[RunResult], float],
        case_b: str | None = None,
    ) -> list[float]:
        """a/b for every round in which both have a run (in round order): what
        :meth:`ratio` takes the median of, and the spread a report shows beside it."""
        base = {r.round: get(r) for r in self.ok(case_b or case, b)}
        return [
            get(r) / base[r.round]
            for r in sorted(self.ok(case, a), key=lambda r: r.round)
            if base.get(r.round) and not math.isnan(base[r.round])
        ]

    def why(self, case: str, server: str) -> str:
        errs = [r.error for r in self.runs.get((case, server), []) if r.error]
        if not errs or not errs[0].strip():
            return "no result"
        return "not measured: " + errs[0].strip().splitlines()[0].replace("|", "/")[:140]

    def copied_pct(self, case: str, server: str) -> float:
        """Copied bytes as % of payload bytes received (pooled over rounds)."""
        runs = self.ok(case, server)
        if not any(r.payload for r in runs):
            return math.nan
        copied = sum(sum(r.copied.values()) for r in runs)
        payload = sum(r.payload.get("in", 0.0) for r in runs)
        return 100 * copied / payload if payload else math.nan

    def copied_sites(self, case: str, server: str) -> dict[str, float]:
        out: dict[str, float] = {}
        for r in self.ok(case, server):
            for k, v in r.copied.items():
                out[k] = out.get(k, 0.0) + v
        return out

    def error_share(self, case: str, server: str) -> float:
        """Failed requests (socket errors, timeouts, non-2xx) as a fraction of attempts."""
        runs = self.ok(case, server)
        errors = sum(r.wrk_errors for r in runs)
        total = errors + sum(r.requests for r in runs)
        return errors / total if total else math.nan

    def first_event(self, case: str, server: str, p: float) -> float:
        """First-event latency percentile, samples pooled over rounds."""
        return percentile([x for r in self.ok(case, server) for x in r.first_event_ms], p)

    def first_event_n(self, case: str, server: str) -> int:
        return sum(len(r.first_event_ms) for r in self.ok(case, server))

    def probe_priorities(self) -> list[str]:
        """The priorities the first-event probe ran at in this grid, each once."""
        return list(
            dict.fromkeys(
                r.probe_priority for rs in self.runs.values() for r in rs if r.probe_priority
            )
        )

    def to_json(self) -> list[dict[str, Any]]:
        return [r.to_json() for runs in self.runs.values() for r in runs]


def run_grid(
    servers: Sequence[Server],
    cases: Sequence[Case],
    settings: Settings,
    delay: Callable[[Case], int] = lambda c: 0,
    case_for: Callable[[Server, Case], Case] | None = None,
) -> Grid:
    """A B A B: per round, per case, every server in turn, each started fresh. A server
    whose start failed once is not started again (the rest would fail too).
    ``case_for`` picks the request a server gets for a case (the gateway sends the direct
    server the same load addressed to its own model); runs are filed under the case."""
    grid = Grid()
    live = []
    for srv in servers:
        why = srv.missing()
        if why:
            grid.skipped[srv.name] = why
        else:
            live.append(srv)
    broken: dict[str, str] = {}
    total, n = settings.rounds * len(cases) * len(live), 0
    for rnd in range(settings.rounds):
        for case in cases:
            for srv in live:
                n += 1
                if srv.name in broken:
                    r = RunResult(
                        server=srv.name, case=case.key, round=rnd, ok=False, error=broken[srv.name]
                    )
                else:
                    sent = case_for(srv, case) if case_for is not None else case
                    r = measure(srv, sent, rnd, settings, delay_ms=delay(case))
                    r.case = case.key
                    if r.error.startswith("start failed"):
                        broken[srv.name] = r.error
                grid.add(r)
                summary = (
                    (
                        f"{r.rps:,.0f} req/s"
                        if case.kind == "echo"
                        else f"{r.events_per_s:,.0f} tokens/s"
                    )
                    + f", p99 {r.latency_pct_ms.get(99.0, math.nan):.2f} ms"
                    if r.ok
                    else r.error[:300]
                )
                print(f"  [{n}/{total}] round {rnd} {case.key} {srv.name}: {summary}", flush=True)
    return grid
