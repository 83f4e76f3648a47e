"""A one-node local Ray for the suites whose servers join a cluster (``cycles``): a head
started with ``ray start --block`` under its own short temp dir, in its own process
group and with a token of its own, then stopped by that group, so no other Ray on the
machine is touched (``ray stop`` would stop every Ray of this user). The servers join it
with ``RAY_ADDRESS`` (:meth:`LocalRay.env`) and its processes are counted from its
group (:meth:`LocalRay.processes`)."""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from ..procs import LOOPBACK, free_port

RAY_BIN = Path(sys.executable).with_name("ray")
# A Ray head (GCS, raylet, agents) is up in seconds on an idle machine and in tens of
# seconds on two busy shared cores.
START_TIMEOUT_S = 120.0
# One probe: a Python that joins the cluster and counts its live nodes.
PROBE_TIMEOUT_S = 60.0
# The head's processes get this long to exit on SIGTERM before the group is killed.
STOP_GRACE_S = 10.0
_PROBE = (
    "import ray, sys\n"
    "ray.init(address=sys.argv[1], logging_level='ERROR', log_to_driver=False, "
    f"_node_ip_address={LOOPBACK!r})\n"
    "print(sum(1 for n in ray.nodes() if n['Alive']))\n"
)


@dataclass(frozen=True)
class LocalRay:
    address: str
    token: str
    proc: subprocess.Popen[bytes]

    def env(self) -> dict[str, str]:
        """What a process joining this Ray needs in its environment."""
        return {"RAY_ADDRESS": self.address, "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": self.token}

    def processes(self) -> int:
        """The live processes of this Ray's process group (GCS, raylet, agents, and the
        workers that run actors and Serve replicas); zombies do not count."""
        return len(group(self.proc.pid))


def group(pgid: int) -> list[int]:
    """The live processes of process group ``pgid`` (zombies left out)."""
    out = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            fields = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if int(fields[2]) == pgid and fields[0] != "Z":
            out.append(int(entry))
    return out


def _stop(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM to the head's group, a bounded wait, then SIGKILL to what is left of it."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(STOP_GRACE_S)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(STOP_GRACE_S)


def _wait_up(ray: LocalRay, env: dict[str, str]) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    last = ""
    while time.monotonic() < deadline:
        if ray.proc.poll() is not None:
            raise RuntimeError(f"ray start exited with {ray.proc.returncode}")
        try:
            res = subprocess.run(
                [sys.executable, "-c", _PROBE, ray.address],
                env=env,
                capture_output=True,
                text=True,
                timeout=PROBE_TIMEOUT_S,
            )
        except subprocess.TimeoutExpired:
            continue
        if res.returncode == 0 and res.stdout.strip().splitlines()[-1:] == ["1"]:
            return
        last = res.stderr.strip().splitlines()[-1] if res.stderr.strip() else res.stdout
        time.sleep(1.0)
    raise RuntimeError(f"the local Ray did not come up in {START_TIMEOUT_S:.0f} s: {last}")


@contextlib.contextmanager
def local_ray(log_dir: Path, env: dict[str, str]) -> Iterator[LocalRay]:
    """A one-node Ray on 127.0.0.1 for the ``with`` block (``env``: the head's, which
    its workers inherit: the server's ``PYTHONPATH`` belongs there)."""
    temp = Path(tempfile.mkdtemp(prefix="zsray-"))  # short: Ray's socket paths are bounded
    port = free_port()
    token = secrets.token_hex(32)
    full = {**env, "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": token}
    log_dir.mkdir(parents=True, exist_ok=True)
    argv = [
        str(RAY_BIN),
        "start",
        "--head",
        "--block",
        "--disable-usage-stats",
        f"--port={port}",
        f"--node-ip-address={LOOPBACK}",
        f"--temp-dir={temp}",
        "--num-cpus=2",
        "--num-gpus=0",
        "--include-dashboard=false",
    ]
    with open(log_dir / f"ray-head-{port}.log", "wb") as log:
        proc = subprocess.Popen(
            argv, env=full, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
    ray = LocalRay(f"{LOOPBACK}:{port}", token, proc)
    try:
        _wait_up(ray, full)
        yield ray
    finally:
        _stop(proc)
        shutil.rmtree(temp, ignore_errors=True)
