"""One process launcher: a real ``zeroserve serve`` subprocess on a free loopback port.

The server runs in its own process group (its own session), so stopping it can reach every
process it started (process-executor workers, llama.cpp's engine) by the group id, and a
Ctrl-C at the test's terminal does not reach it before the fixture that owns it stops it.
Its port comes from its own "serving [...] on URL" line: ``--port 0`` lets the kernel pick.

A test process that ends without its fixtures' teardown (SIGTERM from a runner's time
limit, a run cut short) kills the groups it started at exit, so no server outlives the run
and spins on a shared machine: SIGTERM is turned into ``KeyboardInterrupt`` (pytest stops as
at a Ctrl-C) so that exit handlers run. A SIGKILL of the test process cannot be caught.
"""

from __future__ import annotations

import atexit
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from tests.support.clients import OpenAIClients
from tests.support.timing import scaled

# The repository root: relative paths in a server's arguments, and the test model modules
# (``tests.support.models...``), are found from here.
ROOT = Path(__file__).resolve().parents[2]
_READY = re.compile(r"serving \[(.*)\] on (https?)://([\d.]+):(\d+)")
# Quiet-machine bounds, scaled: a server that does not come up (or go down) in this long has
# failed, not slowed down.
START_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 30.0


@dataclass
class ServerProcess(OpenAIClients):
    """A started server: its process (leader of its own process group) and address."""

    proc: subprocess.Popen[str]
    host: str
    port: int
    models: list[str]
    scheme: str = "http"

    @property
    def url(self) -> str:
        return f"{self.scheme}://{self.host}:{self.port}"

    def stop(self, sig: int = signal.SIGTERM, timeout: float = STOP_TIMEOUT_S) -> int:
        """Send ``sig`` to the server and return its exit status; kill it if it has not
        exited within ``timeout`` (scaled). Whatever it left behind in its process group is
        killed after, so no worker outlives the test."""
        try:
            if self.proc.poll() is None:
                self.proc.send_signal(sig)
                try:
                    return self.proc.wait(scaled(timeout))
                except subprocess.TimeoutExpired:
                    self.proc.kill()
                    return self.proc.wait(scaled(timeout))
            return self.proc.returncode
        finally:
            kill_group(self.proc.pid)


def kill_group(pgid: int) -> None:
    """SIGKILL what is left of the process group ``pgid`` (one started by this module)."""
    _started.discard(pgid)
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


# The process groups ``start_server`` started that no ``kill_group`` has killed yet.
_started: set[int] = set()


def _kill_started() -> None:
    for pgid in list(_started):
        kill_group(pgid)


atexit.register(_kill_started)


def _terminated(signum: int, frame: object) -> None:
    signal.signal(signal.SIGTERM, signal.SIG_DFL)  # a second SIGTERM ends the process
    raise KeyboardInterrupt(f"signal {signum}")


def _track(pgid: int) -> None:
    """Kill ``pgid`` at this process's exit unless a ``stop`` has killed it by then."""
    in_main = threading.current_thread() is threading.main_thread()
    if in_main and signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
        signal.signal(signal.SIGTERM, _terminated)
    _started.add(pgid)


def serve_argv(*args: str) -> list[str]:
    """``zeroserve serve`` on a free port with ``args``, as a command line of this Python."""
    return [sys.executable, "-m", "zeroserve", "serve", "--port", "0", *args]


def server_env(env: dict[str, str] | None = None) -> dict[str, str]:
    """This process's environment with the repository root first on ``PYTHONPATH`` (the
    server, and the workers it spawns, import test models as ``tests.support...``)."""
    full = dict(os.environ)
    full["PYTHONPATH"] = os.pathsep.join([str(ROOT), full.get("PYTHONPATH", "")])
    full["PYTHONUNBUFFERED"] = "1"
    # A server reads no user's ~/.cache/zeroserve (a --models-dir server serves the pull
    # cache): a test that pulls names its own ZEROSERVE_CACHE; this one is never created.
    full.setdefault("ZEROSERVE_CACHE", os.path.join(tempfile.gettempdir(), "zeroserve-no-cache"))
    full.update(env or {})
    return full


def start_server(
    *args: str,
    env: dict[str, str] | None = None,
    loop: str = "auto",
    timeout: float = START_TIMEOUT_S,
    cwd: Path = ROOT,
) -> ServerProcess:
    """Start ``zeroserve serve`` on a free port and wait (bounded, scaled) until it listens.

    Later ``args`` win over the defaults (``--port N`` after the free port's ``--port 0``);
    ``cwd`` is where relative paths in ``args`` are found.
    """
    cmd = [sys.executable, "-m", "zeroserve", "serve", "--host", "127.0.0.1", "--port", "0"]
    proc = subprocess.Popen(
        [*cmd, "--loop", loop, *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=server_env(env),
        cwd=cwd,
        start_new_session=True,
    )
    _track(proc.pid)
    assert proc.stdout is not None
    deadline = time.monotonic() + scaled(timeout)
    lines: list[str] = []
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        lines.append(line)
        m = _READY.search(line)
        if m:
            _drain_in_background(proc)
            return ServerProcess(
                proc, m.group(3), int(m.group(4)), m.group(1).split(", "), m.group(2)
            )
    proc.kill()
    proc.wait()
    kill_group(proc.pid)
    proc.stdout.close()
    raise RuntimeError("server did not start:\n" + "".join(lines))


def _drain_in_background(proc: subprocess.Popen[str]) -> None:
    def pump() -> None:
        assert proc.stdout is not None
        with proc.stdout:  # closed at the server's EOF: no unclosed-file warning
            for line in proc.stdout:
                if os.environ.get("ZEROSERVE_TEST_VERBOSE"):
                    sys.stderr.write(line)

    threading.Thread(target=pump, daemon=True).start()
