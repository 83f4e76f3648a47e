"""A real local Ray cluster for the ``executor="ray"`` tests (the fixture is in
conftest): two Ray nodes on this one machine (a head, and a second node offering the custom resource ``node_b``; the head offers ``node_a``), or the head alone, started
once per module under the test's own temp dir and stopped by process group, so no other
Ray on the machine is touched (``ray stop`` would stop every Ray of this user)."""

from __future__ import annotations

import os
import secrets
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.support import scaled, wait_until

ROOT = Path(__file__).resolve().parents[2]
RAY_BIN = Path(sys.executable).with_name("ray")
# Bringing up a Ray node (GCS, raylet, agents) takes seconds on an idle machine and
# tens of seconds on two busy shared cores.
NODE_START_TIMEOUT_S = 120.0
# One probe of the cluster's nodes (a Python that joins the cluster and asks it).
PROBE_TIMEOUT_S = 60.0
# How long a node's processes get to exit on SIGTERM before the group is killed.
NODE_STOP_TIMEOUT_S = 10.0
# A one-off driver (connect, one query or kill, disconnect) on a busy machine.
DRIVER_TIMEOUT_S = 120.0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@dataclass
class RayCluster:
    address: str
    temp_dir: Path
    nodes: list[subprocess.Popen[bytes]]

    def env(self) -> dict[str, str]:
        """The environment of a zeroserve process joining this cluster (the auth token
        is already in this process's environment, see ``ray_cluster``)."""
        env = dict(os.environ)
        env["RAY_ADDRESS"] = self.address
        paths = [str(ROOT / "src"), str(ROOT), str(ROOT / "tests" / "runtime")]
        env["PYTHONPATH"] = os.pathsep.join([*paths, env.get("PYTHONPATH", "")])
        return env

    def driver(self, code: str, *args: str) -> str:
        """Run ``code`` as a Ray driver of this cluster in the ``zeroserve`` namespace (a
        fresh process: Ray reads its auth settings at import) and return its stdout."""
        prelude = (
            "import ray, sys\n"
            f"ray.init(address={self.address!r}, namespace='zeroserve', "
            "logging_level='ERROR', log_to_driver=False, _node_ip_address='127.0.0.1')\n"
        )
        res = subprocess.run(
            [sys.executable, "-c", prelude + code, *args],
            env=self.env(),
            capture_output=True,
            text=True,
            timeout=DRIVER_TIMEOUT_S,
        )
        if res.returncode != 0:
            raise RuntimeError(f"Ray driver failed:\n{res.stderr[-4000:]}")
        return res.stdout


def _start_node(args: list[str], env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    with open(log, "wb") as out:
        return subprocess.Popen(
            [str(RAY_BIN), "start", "--block", "--disable-usage-stats", *args],
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its own process group: stopped by group, alone
        )


def _stop_node(proc: subprocess.Popen[bytes]) -> None:
    try:
        os.killpg(proc.pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    try:
        proc.wait(NODE_STOP_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        pass
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()


def _wait_nodes(address: str, n: int) -> None:
    """Poll (with a deadline) until ``n`` nodes are alive in the cluster."""
    code = (
        "import ray,sys; ray.init(address=sys.argv[1], logging_level='ERROR', "
        "log_to_driver=False, _node_ip_address='127.0.0.1'); print(sum(1 for x in ray.nodes() if x['Alive']))"
    )

    def reached() -> bool:
        res = subprocess.run(
            [sys.executable, "-c", code, address],
            capture_output=True,
            text=True,
            timeout=scaled(PROBE_TIMEOUT_S),
        )
        return res.returncode == 0 and res.stdout.strip().splitlines()[-1:] == [str(n)]

    wait_until(reached, NODE_START_TIMEOUT_S, f"the Ray cluster to reach {n} nodes")


def _only_loopback() -> bool:
    return {name for _, name in socket.if_nameindex()} <= {"lo"}


def ray_cluster_fixture(
    tmp_path_factory: pytest.TempPathFactory, nodes: int = 2
) -> Iterator[RayCluster]:
    if not _only_loopback():
        # Two Ray nodes register the host's routable address, not 127.0.0.1: the suite
        # runs only where that address is loopback (`make test` does this).
        pytest.skip(
            "the Ray suite runs in a loopback-only network namespace: "
            "tools/loopback-netns pytest tests/ray"
        )
    with pytest.MonkeyPatch.context() as mp:
        # Ray's token authentication, with a token of this cluster's own: every process
        # of the test (nodes, servers, this driver) reads it from the environment.
        mp.setenv("RAY_AUTH_MODE", "token")
        mp.setenv("RAY_AUTH_TOKEN", secrets.token_hex(32))

        yield from _cluster(tmp_path_factory.mktemp("ray"), nodes)


def stop(cluster: RayCluster) -> None:
    """Stop every node of ``cluster`` (the test's own), the head last."""
    for proc in reversed(cluster.nodes):
        _stop_node(proc)


def _cluster(temp: Path, count: int) -> Iterator[RayCluster]:
    port = _free_port()
    address = f"127.0.0.1:{port}"
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        [str(ROOT / "src"), str(ROOT), str(ROOT / "tests" / "runtime"), env.get("PYTHONPATH", "")]
    )
    common = ["--node-ip-address=127.0.0.1", f"--temp-dir={temp}", "--num-gpus=0"]
    nodes = [
        _start_node(
            [
                "--head",
                f"--port={port}",
                "--num-cpus=2",
                '--resources={"node_a": 1}',
                "--include-dashboard=false",
                *common,
            ],
            env,
            temp / "head.log",
        )
    ]
    try:
        _wait_nodes(address, 1)
        if count == 1:
            yield RayCluster(address, temp, nodes)
            return
        nodes.append(
            _start_node(
                [f"--address={address}", "--num-cpus=1", '--resources={"node_b": 1}', *common],
                env,
                temp / "node_b.log",
            )
        )
        _wait_nodes(address, 2)
        yield RayCluster(address, temp, nodes)
    finally:
        for proc in reversed(nodes):
            _stop_node(proc)
