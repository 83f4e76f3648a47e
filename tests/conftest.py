"""Shared fixtures: real zeroserve processes on loopback."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))  # so spawned workers can import tests.* model modules

_READY = re.compile(r"serving \[(.*)\] on (https?)://([\d.]+):(\d+)")
START_TIMEOUT_S = 60.0


@dataclass
class ServerProcess:
    proc: subprocess.Popen[str]
    host: str
    port: int
    models: list[str]
    scheme: str = "http"

    @property
    def url(self) -> str:
        return f"{self.scheme}://{self.host}:{self.port}"

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 30.0) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                return self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                return self.proc.wait(timeout)
        return self.proc.returncode


def serve_argv(*args: str) -> list[str]:
    """``zeroserve serve`` on a free port with ``args``, as a command line of this Python."""
    return [sys.executable, "-m", "zeroserve", "serve", "--port", "0", *args]


def start_server(
    *args: str,
    env: dict[str, str] | None = None,
    loop: str = "auto",
    timeout: float = START_TIMEOUT_S,
    cwd: Path = ROOT,
) -> ServerProcess:
    """Start ``zeroserve serve`` on a free port and wait (bounded) until it listens. Later
    ``args`` win over the defaults (``--port N`` after the free port's ``--port 0``);
    ``cwd`` is where relative paths in ``args`` (and model modules) are found."""
    full_env = dict(os.environ)
    full_env["PYTHONPATH"] = os.pathsep.join([str(ROOT), full_env.get("PYTHONPATH", "")])
    full_env["PYTHONUNBUFFERED"] = "1"
    full_env.update(env or {})
    cmd = [
        sys.executable,
        "-m",
        "zeroserve",
        "serve",
        "--host",
        "127.0.0.1",
        "--port",
        "0",
        "--loop",
        loop,
        *args,
    ]
    proc = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=full_env, cwd=cwd
    )
    assert proc.stdout is not None
    deadline = time.monotonic() + timeout
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
    proc.stdout.close()
    raise RuntimeError("server did not start:\n" + "".join(lines))


def _drain_in_background(proc: subprocess.Popen[str]) -> None:
    import threading

    def pump() -> None:
        assert proc.stdout is not None
        with proc.stdout:  # closed at the server's EOF: no unclosed-file warning
            for line in proc.stdout:
                if os.environ.get("ZEROSERVE_TEST_VERBOSE"):
                    sys.stderr.write(line)

    threading.Thread(target=pump, daemon=True).start()


@pytest.fixture(scope="session", params=["uvloop", "asyncio"])
def loop_name(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture(scope="session")
def echo_server(loop_name: str) -> Iterator[ServerProcess]:
    server = start_server("--model", "echo", loop=loop_name)
    yield server
    assert server.stop() == 0
