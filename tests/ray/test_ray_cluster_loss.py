"""A Ray cluster that goes away under a running zeroserve (one Ray node, the test's own,
stopped mid-run): the request in flight on it and an open stream fail with 503, ``/ready``
says the cluster is unreachable, new requests get 503 with ``Retry-After`` at once
instead of waiting for their deadline, and the ingress stays up and stops cleanly."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.ray.cluster import RayCluster, ray_cluster_fixture, stop
from tests.ray.test_ray_executor import WAIT_S, _raw
from tests.support import ServerProcess, start_server, wait_until

pytest.importorskip("ray")

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

SERVER_START_TIMEOUT_S = 180.0
# Longer than any wait below, and shorter than the models' deadline: a request that
# waited for its deadline would fail the test by this timeout, not by a 504.
CLIENT_TIMEOUT_S = 60.0
DEADLINE_S = 3 * CLIENT_TIMEOUT_S
NEAR = "executor=ray&num_cpus=0.25"


@pytest.fixture
def lone_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RayCluster]:
    yield from ray_cluster_fixture(tmp_path_factory, nodes=1)


@pytest.fixture
def server(lone_cluster: RayCluster, tmp_path: Path) -> Iterator[ServerProcess]:
    stuck = f"started={tmp_path / 'started'}&release={tmp_path / 'release'}"
    server = start_server(
        "--model",
        f"echo?{NEAR}",
        "--model",
        f"stuck=tests.support.models.ray_actors:Stuck?{NEAR}&{stuck}",
        "--request-timeout",
        str(DEADLINE_S),
        env=lone_cluster.env(),
        timeout=SERVER_START_TIMEOUT_S,
    )
    yield server
    server.stop()


def _unavailable(r: httpx.Response) -> None:
    assert r.status_code == 503, r.text
    assert int(r.headers["retry-after"]) >= 1
    assert r.json()["error"]["code"] == "cluster_unavailable", r.text


def test_lost_cluster_gives_503_with_retry_after_and_never_hangs(
    lone_cluster: RayCluster, server: ServerProcess, tmp_path: Path
) -> None:
    assert _raw(server.url, "echo", b"before").content == b"before"
    # A stream with one piece delivered, and an infer, both waiting on their actor.
    http = httpx.Client(timeout=CLIENT_TIMEOUT_S)
    events: list[str] = []
    with http.stream(
        "POST",
        f"{server.url}/v1/raw/stuck",
        content=b"go",
        headers={"Accept": "text/event-stream"},
    ) as stream:
        lines = stream.iter_lines()
        events += [next(line for line in lines if line.startswith("data:"))]
        started = tmp_path / "started"
        wait_until(started.exists, WAIT_S, "the stream to reach the actor's wait")
        started.unlink()
        result: list[httpx.Response] = []
        client = threading.Thread(
            target=lambda: result.append(_raw(server.url, "stuck", b"payload"))
        )
        client.start()
        wait_until(started.exists, WAIT_S, "the infer to reach the actor's wait")
        stop(lone_cluster)
        events += [line for line in lines if line.startswith("data:")]
    http.close()
    assert events[0] == "data: first" and len(events) == 2, events
    assert "error" in json.loads(events[1][len("data:") :]), events
    client.join(CLIENT_TIMEOUT_S)
    assert result and result[0].status_code == 503, result
    # /ready names the reason; new work is refused at once, with Retry-After.
    wait_until(
        lambda: httpx.get(f"{server.url}/ready").status_code == 503, WAIT_S, "/ready to drop"
    )
    ready = httpx.get(f"{server.url}/ready").json()
    assert "unreachable" in ready["detail"]["models"]["echo"]["reason"], ready
    _unavailable(_raw(server.url, "echo", b"after"))
    _unavailable(_raw(server.url, "echo", b"after", stream="1"))
    assert server.proc.poll() is None  # the ingress outlives its cluster
    assert server.stop() == 0
