"""Ray models come and go at run time (docs/architecture.md, "Models at run time"): a
``--models-dir`` entry with ``executor = "ray"`` or ``"ray-serve"`` is loaded and unloaded
through llama.cpp router's routes on the real two-node cluster, twice; it answers while
loaded, its memory counts its actors' RSS (they run on the server's node), and after
each unload every process that held it (its actors, its Serve replicas) is gone; the
server, which joined Ray at run time, still drains and exits 0 on SIGTERM."""

from __future__ import annotations

import json
import os
from pathlib import Path

import httpx
import pytest

from tests.ray.cluster import RayCluster
from tests.support import ServerProcess, scaled, start_server, wait_until
from tests.support.observe import model_metric
from zeroserve.runtime.model_memory import pids_rss

pytest.importorskip("ray")

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

SERVER_START_TIMEOUT_S = 180.0
# A Ray load places actors (or a Serve deployment) on the cluster: seconds on a quiet machine.
LOAD_WAIT_S = 120.0
PLACEMENTS = {
    "near-actors": {"executor": "ray", "num_cpus": 0, "resources": '{"node_a":0.1}'},
    "near-serve": {"executor": "ray-serve", "num_cpus": 0, "resources": '{"node_a":0.1}'},
}


def write_models(root: Path, placements: dict[str, dict[str, object]]) -> Path:
    """A ``--models-dir`` under ``root``: one ``Recorded`` model per placement, each
    recording its actors' pids in ``root/NAME.pids``."""
    for name, placement in placements.items():
        folder = root / name
        folder.mkdir()
        options = {**placement, "pids": str(root / f"{name}.pids")}
        lines = [f"{key} = {json.dumps(value)}" for key, value in options.items()]
        spec = 'spec = "tests.support.models.ray_actors:Recorded"'
        (folder / "model.toml").write_text("\n".join([spec, "[options]", *lines]) + "\n")
    return root


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_models(tmp_path_factory.mktemp("ray-models"), PLACEMENTS)


def _serve(ray_cluster: RayCluster, models: Path) -> ServerProcess:
    return start_server(
        "--models-dir",
        str(models),
        "--model",
        "echo",
        env=ray_cluster.env(),
        timeout=SERVER_START_TIMEOUT_S,
    )


def _state(server: ServerProcess, name: str) -> str:
    r = httpx.get(server.url + "/models", timeout=scaled(LOAD_WAIT_S))
    assert r.status_code == 200
    states = {m["id"]: m["status"]["value"] for m in r.json()["data"]}
    return str(states[name])


def _alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie, exited and not yet reaped, does not)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except FileNotFoundError:
        return False
    return "\nState:\tZ" not in status


def _pids(models: Path, name: str) -> set[int]:
    path = models / f"{name}.pids"
    return {int(line) for line in path.read_text().split()} if path.exists() else set()


def _doubles(server: ServerProcess, name: str) -> None:
    body = {"inputs": [{"name": "x", "shape": [3], "datatype": "FP32", "data": [1, 2, 3]}]}
    r = httpx.post(f"{server.url}/v2/models/{name}/infer", json=body, timeout=scaled(LOAD_WAIT_S))
    assert r.status_code == 200, r.text
    (out,) = r.json()["outputs"]
    assert (out["name"], out["data"]) == ("y", [2.0, 4.0, 6.0])


@pytest.mark.parametrize("name", list(PLACEMENTS))
def test_a_ray_model_loads_serves_and_its_unload_leaves_no_process(
    ray_cluster: RayCluster, models: Path, name: str
) -> None:
    server = _serve(ray_cluster, models)
    try:
        _load_and_unload_twice(server, models, name)
    finally:
        status = server.stop()
    # Its connection to the cluster was made at run time, off the main thread, and left
    # when the model unloaded: Ray's core worker would have taken SIGTERM from the drain
    # handler, yet the server drains and exits 0 (docs/models.md, "Models at run time").
    assert status == 0


def _load_and_unload_twice(server: ServerProcess, models: Path, name: str) -> None:
    assert _state(server, name) == "unloaded"
    held: set[int] = set()
    for _ in range(2):
        r = httpx.post(
            server.url + "/models/load", json={"model": name}, timeout=scaled(LOAD_WAIT_S)
        )
        assert r.status_code == 200, r.text
        assert _state(server, name) == "loaded"
        _doubles(server, name)
        new = _pids(models, name) - held
        assert new and all(_alive(pid) for pid in new), new  # a fresh actor or replica
        held |= new
        assert os.getpid() not in held  # Ray's processes, not the test's or the server's
        # The actor or replica runs on the server's node: its RSS is the model's memory
        # (docs/models.md, "Memory"), far above the server's own growth across a load.
        actor_rss = pids_rss(new)
        memory = model_metric(server.url, "zeroserve_model_memory_bytes", name)
        assert actor_rss > 0 and memory >= actor_rss // 2, (memory, actor_rss)
        r = httpx.post(
            server.url + "/models/unload", json={"model": name}, timeout=scaled(LOAD_WAIT_S)
        )
        assert r.status_code == 200, r.text
        wait_until(lambda: _state(server, name) == "unloaded", LOAD_WAIT_S, f"{name} unloaded")
        wait_until(
            lambda pids=frozenset(held): not any(_alive(pid) for pid in pids),
            LOAD_WAIT_S,
            f"every process that held {name} gone",
        )
    echo = httpx.post(f"{server.url}/v1/raw/echo", content=b"still", timeout=scaled(LOAD_WAIT_S))
    assert echo.content == b"still"  # the other model served throughout
