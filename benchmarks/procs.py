"""Processes under test: start pinned, wait until healthy, account CPU and memory, stop.

Every process the harness starts is tracked by PID (and its start time, so a recycled PID
is never signalled). Stopping sends SIGTERM to that PID, waits a bounded time, then
SIGKILL; descendants seen while the process ran are stopped the same way. Nothing else is
ever signalled. All network traffic goes to 127.0.0.1.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import signal
import socket
import ssl
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .machine import pin_prefix

LOOPBACK = "127.0.0.1"
# A server gets this long to answer GET /health after start (interpreter start-up plus
# model loading); past it the server counts as failed for the run.
# (External peers, MLServer, LiteLLM, Triton, get their own, longer, timeout.)
READY_TIMEOUT_S = 60.0
READY_POLL_S = 0.05
# SIGTERM first so servers drain and exit cleanly; SIGKILL past this grace period.
STOP_GRACE_S = 5.0
# RSS sampling period while a load runs; peak RSS is the max of the samples and VmHWM.
RSS_SAMPLE_S = 0.1
TREE_SCAN_S = 1.0

ROOT = Path(__file__).resolve().parents[1]  # the repository root
_CLK_TCK = os.sysconf("SC_CLK_TCK")
_PAGE = os.sysconf("SC_PAGE_SIZE")


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((LOOPBACK, 0))
        port: int = s.getsockname()[1]
        return port


def _stat(pid: int) -> list[str] | None:
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # comm may contain spaces and parentheses; fields resume after the last ')'.
    return raw[raw.rindex(")") + 2 :].split()


def _start_time(pid: int) -> int | None:
    st = _stat(pid)
    return int(st[19]) if st else None


def cpu_seconds(pid: int) -> float:
    """utime + stime of one process, in seconds (0 when it is gone)."""
    st = _stat(pid)
    if st is None:
        return 0.0
    return (int(st[11]) + int(st[12])) / _CLK_TCK


def _status_kib(pid: int, key: str) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(key + ":"):
                return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        pass
    return 0


def descendants(pid: int) -> list[int]:
    """PIDs of every live descendant of ``pid`` (one /proc scan)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        st = _stat(int(entry))
        if st is not None:
            children.setdefault(int(st[1]), []).append(int(entry))
    out: list[int] = []
    todo = [pid]
    while todo:
        for c in children.get(todo.pop(), []):
            out.append(c)
            todo.append(c)
    return out


@dataclass
class Usage:
    """CPU and memory of a process tree at one instant."""

    cpu_s: float
    rss_kib: int
    hwm_kib: int


@dataclass
class ServerProcess:
    """A server under test, started by :func:`start_server`."""

    name: str
    argv: list[str]
    port: int
    log_path: Path
    proc: subprocess.Popen[bytes]
    tls: bool = False  # serves HTTPS
    _known: dict[int, int] = field(default_factory=dict)  # pid -> start time
    _peak_rss_kib: int = 0
    _sampler: threading.Thread | None = None
    _sampling: threading.Event = field(default_factory=threading.Event)

    @property
    def pid(self) -> int:
        return self.proc.pid

    def tree(self) -> list[int]:
        pids = [self.pid, *descendants(self.pid)]
        for p in pids:
            if p not in self._known:
                t = _start_time(p)
                if t is not None:
                    self._known[p] = t
        return pids

    def usage(self) -> Usage:
        pids = self.tree()
        return Usage(
            cpu_s=sum(cpu_seconds(p) for p in pids),
            rss_kib=sum(_status_kib(p, "VmRSS") for p in pids),
            hwm_kib=sum(_status_kib(p, "VmHWM") for p in pids),
        )

    def reset_peak_rss(self) -> bool:
        """Reset every process's peak RSS (``VmHWM``) to its RSS now (Linux's
        ``clear_refs`` with 5), so the next :meth:`usage` reads the peak of what runs in
        between, not of the process's life. False where the kernel refuses it."""
        try:
            for pid in self.tree():
                Path(f"/proc/{pid}/clear_refs").write_text("5")
        except OSError:
            return False
        return True

    def start_sampling(self) -> None:
        self._peak_rss_kib = 0
        self._sampling.set()

        def loop() -> None:
            # A /proc scan for new descendants costs more than reading RSS; do it ~1/s.
            pids, scanned = self.tree(), time.monotonic()
            while self._sampling.is_set():
                if time.monotonic() - scanned > TREE_SCAN_S:
                    pids, scanned = self.tree(), time.monotonic()
                rss = sum(_status_kib(p, "VmRSS") for p in pids)
                self._peak_rss_kib = max(self._peak_rss_kib, rss)
                time.sleep(RSS_SAMPLE_S)

        self._sampler = threading.Thread(target=loop, name=f"rss-{self.name}", daemon=True)
        self._sampler.start()

    def stop_sampling(self) -> int:
        """Stop the RSS sampler; return the peak sampled RSS of the tree, in KiB."""
        self._sampling.clear()
        if self._sampler is not None:
            self._sampler.join(timeout=2.0)
            self._sampler = None
        return self._peak_rss_kib

    def alive(self) -> bool:
        return self.proc.poll() is None

    def log_tail(self, nbytes: int = 2000) -> str:
        try:
            data = self.log_path.read_bytes()
        except OSError:
            return ""
        return data[-nbytes:].decode("utf-8", "replace")

    def stop(self) -> None:
        """SIGTERM, bounded wait, SIGKILL: the server, then descendants it left behind."""
        if self.alive():
            self.tree()
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signal.SIGTERM)
        try:
            self.proc.wait(timeout=STOP_GRACE_S)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                self.proc.kill()
            self.proc.wait(timeout=STOP_GRACE_S)
        deadline = time.monotonic() + STOP_GRACE_S
        for pid, started in self._known.items():
            if pid == self.pid:
                continue
            while _start_time(pid) == started and time.monotonic() < deadline:
                time.sleep(0.05)
            if _start_time(pid) == started:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)


class ServerFailed(RuntimeError):
    """The server exited or never answered /health."""


def child_env(extra: dict[str, str] | None) -> dict[str, str]:
    """The child's environment: the repository root on PYTHONPATH, so a server can load
    the bench models (``benchmarks.models``) and a peer module can run as ``-m``."""
    env = {**os.environ, **(extra or {})}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH", "")) if p)
    return env


def script_json(argv: list[str], timeout_s: int) -> dict[str, Any] | str:
    """Run ``argv`` (one of ``scripts/`` with ``--json``, or a ``python -c``) from the
    repository root: its last line's JSON, or why it gave none."""
    try:
        done = subprocess.run(
            argv,
            capture_output=True,
            text=True,
            timeout=timeout_s,
            check=False,
            env=child_env(None),
            cwd=ROOT,
        )
    except subprocess.TimeoutExpired:
        return f"timed out after {timeout_s} s"
    if done.returncode:
        return (done.stderr.strip().splitlines() or [f"exit {done.returncode}"])[-1][:140]
    got: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return got


def start_server(
    name: str,
    argv: Sequence[str],
    port: int,
    log_dir: Path,
    cpu: int | None,
    env: dict[str, str] | None = None,
    health: str = "/health",
    ready_timeout_s: float = READY_TIMEOUT_S,
    tls: bool = False,
) -> ServerProcess:
    """Start ``argv`` pinned to ``cpu`` and return once GET ``health`` answers 200
    (over TLS when ``tls``)."""
    log_dir.mkdir(parents=True, exist_ok=True)
    log_path = log_dir / f"{name}-{port}.log"
    full = [*pin_prefix(cpu), *argv]
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            full,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=child_env(env),
        )
    server = ServerProcess(name=name, argv=full, port=port, log_path=log_path, proc=proc, tls=tls)
    try:
        wait_healthy(server, health, ready_timeout_s, tls=tls)
    except BaseException:
        server.stop()
        raise
    return server


def wait_healthy(
    server: ServerProcess,
    health: str = "/health",
    timeout_s: float = READY_TIMEOUT_S,
    tls: bool = False,
) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not server.alive():
            raise ServerFailed(
                f"{server.name} exited with {server.proc.returncode}:\n{server.log_tail()}"
            )
        try:
            status, _ = http_get(server.port, health, timeout_s=1.0, tls=tls)
            if status == 200:
                return
        except OSError:
            pass
        time.sleep(READY_POLL_S)
    raise ServerFailed(f"{server.name} not healthy after {timeout_s:.0f} s:\n{server.log_tail()}")


def _unverified() -> ssl.SSLContext:
    """The benchmark's TLS client context: the servers' certificate is self-signed and
    made for the run (``servers.bench_certs``), so it is not verified."""
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    return ctx


def _connect(port: int, timeout_s: float, tls: bool) -> http.client.HTTPConnection:
    if tls:
        return http.client.HTTPSConnection(LOOPBACK, port, timeout=timeout_s, context=_unverified())
    return http.client.HTTPConnection(LOOPBACK, port, timeout=timeout_s)


def http_get(port: int, path: str, timeout_s: float = 5.0, tls: bool = False) -> tuple[int, bytes]:
    conn = _connect(port, timeout_s, tls)
    try:
        conn.request("GET", path)
        resp = conn.getresponse()
        return resp.status, resp.read()
    finally:
        conn.close()


def http_post(
    port: int,
    path: str,
    body: bytes,
    headers: dict[str, str],
    timeout_s: float = 30.0,
    tls: bool = False,
) -> tuple[int, dict[str, str], bytes]:
    conn = _connect(port, timeout_s, tls)
    try:
        conn.request("POST", path, body=body, headers=headers)
        resp = conn.getresponse()
        return resp.status, {k.lower(): v for k, v in resp.getheaders()}, resp.read()
    finally:
        conn.close()


# A busy loop's own bound, past the window it is meant to cover: it exits by itself even
# if the harness dies before stopping it.
BUSY_SLACK_S = 30.0


@contextlib.contextmanager
def busy_loop(cpu: int | None, seconds: float) -> Iterator[subprocess.Popen[bytes]]:
    """One process spinning on ``cpu`` (a stand-in for an engine thread that keeps its
    core busy) for at most ``seconds`` plus slack; stopped by PID on the way out."""
    spin = f"import time\nend = time.monotonic() + {seconds + BUSY_SLACK_S}\n"
    spin += "while time.monotonic() < end:\n    pass\n"
    proc = subprocess.Popen(
        [*pin_prefix(cpu), sys.executable, "-c", spin], stdin=subprocess.DEVNULL
    )
    try:
        yield proc
    finally:
        proc.kill()
        proc.wait()
