"""Load/unload cycles of Ray models leave nothing behind (docs/models.md, "Models at run
time"): ``CYCLES`` cycles of one ``--models-dir`` model through llama.cpp router's
routes, on the real two-node cluster, for Ray actors on the server's node and on the
other one (``same_node=never``) and for a Serve deployment. After them no actor, Serve
application or replica of the server is on the cluster, every process that held the
model has exited, and the server holds the same shared-memory segments and processes in
its group as after the first cycle.

Each cycle joins Ray and leaves it (the last model using Ray leaves the cluster). Its
threads may not grow: Ray's OpenTelemetry metric reader, one thread per ``ray.init`` that
``ray.shutdown`` never stops, is off in the server (runtime/ray/cluster.py); only
``GRPC_TIMER_THREADS``, a gRPC timer thread that comes and goes, is allowed over the
first cycle. Its file descriptors may grow by the placement's residue per cycle and no
more: Ray's gRPC client in the server leaves one unconnected TCPv6 socket a cycle, two
for actors on the other node (lsof; zeroserve's own sockets to Ray are IPv4,
docs/decisions/0058-load-unload-cycles.md). A Serve handle's router left running past
the leave joined Ray again on its own: six threads and descriptors a cycle, and a join
that raced the next load's ("ray.init twice"); that is what the bounds catch.

A cycle joins Ray, places the actors or deploys the Serve application, answers one
request, unloads and leaves Ray: seconds, so the count is small. The full count per
kind is the ``cycles`` benchmark suite's (``python -m benchmarks --suites cycles``)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import httpx
import pytest

from tests.ray.cluster import RayCluster
from tests.ray.test_ray_load_unload import LOAD_WAIT_S, _doubles, _pids, _state, write_models
from tests.support import ServerProcess, scaled, start_server, wait_until
from tests.support.observe import server_fds

pytest.importorskip("ray")

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

CYCLES = 3
# Threads over the first cycle's count that may come and go (module doc).
GRPC_TIMER_THREADS = 1
SERVER_START_TIMEOUT_S = 180.0
PLACEMENTS = {
    "near-actors": {"executor": "ray", "num_cpus": 0, "resources": '{"node_a":0.1}'},
    "far-actors": {
        "executor": "ray",
        "num_cpus": 0,
        "resources": '{"node_b":0.1}',
        "same_node": "never",
    },
    "near-serve": {"executor": "ray-serve", "num_cpus": 0, "resources": '{"node_a":0.1}'},
}
# Descriptors a cycle of each placement may leave in the server: Ray's sockets (module doc).
RAY_FDS_PER_CYCLE = {"near-actors": 1, "far-actors": 2, "near-serve": 1}

# The server's named actors and Serve applications still on the cluster (their names
# carry the server's pid: runtime/ray/actors.py, runtime/ray/serve/deployment.py).
_LEFT = """
import json
from ray import serve
from ray.util import list_named_actors
ours = (sys.argv[1] + "-", "zeroserve-" + sys.argv[1] + "-")
actors = [a["name"] for a in list_named_actors(all_namespaces=True)]
try:
    apps = list(serve.status().applications)
except Exception:  # no Serve controller: no application
    apps = []
print(json.dumps(sorted(n for n in actors + apps if n.startswith(ours))))
"""


@pytest.fixture(scope="module")
def cycled(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_models(tmp_path_factory.mktemp("ray-cycled"), PLACEMENTS)


def _group(pgid: int) -> set[int]:
    out = set()
    for p in Path("/proc").iterdir():
        if not p.name.isdigit():
            continue
        try:
            fields = (p / "stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if int(fields[2]) == pgid and fields[0] != "Z":
            out.add(int(p.name))
    return out


def _segments(pid: int) -> set[str]:
    """The memfd and /dev/shm files ``pid`` maps (the arena, Ray's object store)."""
    maps = Path(f"/proc/{pid}/maps").read_text().splitlines()
    return {
        f"{parts[3]}:{parts[4]}"
        for parts in (line.split(None, 5) for line in maps)
        if len(parts) == 6 and parts[5].startswith(("/memfd:", "/dev/shm/"))
    }


def _footprint(server: ServerProcess) -> tuple[int, int, set[int], set[str]]:
    pid = server.proc.pid
    threads = len(os.listdir(f"/proc/{pid}/task"))
    return server_fds(pid, server.port), threads, _group(pid), _segments(pid)


def _alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def _cycle(server: ServerProcess, name: str) -> None:
    r = httpx.post(server.url + "/models/load", json={"model": name}, timeout=scaled(LOAD_WAIT_S))
    assert r.status_code == 200, r.text
    _doubles(server, name)
    r = httpx.post(server.url + "/models/unload", json={"model": name}, timeout=scaled(LOAD_WAIT_S))
    assert r.status_code == 200, r.text
    wait_until(lambda: _state(server, name) == "unloaded", LOAD_WAIT_S, f"{name} unloaded")


def _left(ray_cluster: RayCluster, server: ServerProcess) -> list[str]:
    out = ray_cluster.driver(_LEFT, str(server.proc.pid)).strip().splitlines()[-1]
    return list(json.loads(out))


@pytest.mark.parametrize("name", list(PLACEMENTS))
def test_ray_load_unload_cycles_leave_no_actor_app_process_fd_segment_or_thread(
    ray_cluster: RayCluster, cycled: Path, name: str
) -> None:
    server = start_server(
        "--models-dir",
        str(cycled),
        env=ray_cluster.env(),
        timeout=SERVER_START_TIMEOUT_S,
    )
    try:
        _cycle(server, name)  # warm: Ray's imports and one-time allocations
        fds, threads, group, segments = _footprint(server)
        for _ in range(CYCLES):
            _cycle(server, name)
        held = _pids(cycled, name)
        assert len(held) >= CYCLES + 1  # a fresh actor or replica each load
        wait_until(
            lambda: not any(_alive(p) for p in held), LOAD_WAIT_S, f"every process of {name} gone"
        )
        # Ray's threads and sockets of the last leave may still be closing: wait, bounded.
        most_fds = fds + CYCLES * RAY_FDS_PER_CYCLE[name]
        most_threads = threads + GRPC_TIMER_THREADS

        def within() -> bool:
            now = _footprint(server)
            return now[0] <= most_fds and now[1] <= most_threads

        what = f"at most {most_fds} fds and {most_threads} threads (after the first cycle: "
        try:
            wait_until(within, LOAD_WAIT_S, what + f"{fds} and {threads})")
        except AssertionError as exc:
            now = _footprint(server)
            raise AssertionError(f"{exc}; now {now[0]} fds and {now[1]} threads") from None
        now = _footprint(server)
        assert (now[2], now[3]) == (group, segments), (now, group, segments)
        assert _left(ray_cluster, server) == []
    finally:
        status = server.stop()
    assert status == 0
