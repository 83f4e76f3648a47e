"""Where the harness places what it starts: the server under test on SERVER_CPU, while the
harness itself (and so every process it starts) runs pinned to LOAD_CPU. Read back from
``/proc``: the affinity each started process really has."""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path

import pytest

from benchmarks import machine, procs, servers

pytestmark = pytest.mark.skipif(
    not machine.Pinning.detect().pinned or shutil.which("taskset") is None,
    reason="needs CPUs 0 and 1 and taskset",
)


def _allowed(pid: int) -> str:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("Cpus_allowed_list:"):
            return line.split(":", 1)[1].strip()
    raise AssertionError(f"no Cpus_allowed_list for {pid}")


def _spinning(cmdline: bytes) -> bool:
    argv = cmdline.split(b"\0")
    return not argv[0].endswith(b"taskset") and b"-c" in argv and b"while" in cmdline


def test_a_server_started_by_the_pinned_harness_runs_on_the_server_cpu(tmp_path: Path) -> None:
    # The harness pins itself to the load CPU first (cli.py); a server it starts then must
    # not inherit that CPU. It did, when placement was judged by the narrowed affinity.
    pins = machine.Pinning.detect()
    srv = servers.zeroserve(servers.ECHO)
    with machine.harness_on_load_cpu(pins):
        assert _allowed(os.getpid()) == str(pins.load_cpu)
        with servers.started(srv, pins, tmp_path) as server:
            assert _allowed(server.proc.pid) == str(pins.server_cpu)


def test_the_busy_core_stand_in_spins_on_the_cpu_it_is_given() -> None:
    pins = machine.Pinning.detect()
    with machine.harness_on_load_cpu(pins), procs.busy_loop(pins.server_cpu, 5.0) as spin:
        # The child is first a copy of this process, then ``taskset`` (which sets the
        # affinity), then the spinning Python, all under one PID: wait for the last.
        deadline = time.monotonic() + 10.0
        cmdline = Path(f"/proc/{spin.pid}/cmdline")
        while not _spinning(cmdline.read_bytes()):
            assert time.monotonic() < deadline, "the busy loop never started"
            time.sleep(0.01)
        assert _allowed(spin.pid) == str(pins.server_cpu)
