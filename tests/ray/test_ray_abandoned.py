"""A hung Ray actor whose client left is reclaimed within the hang grace after the
disconnect, not after the request's deadline, for actors reached through a link (near)
and by Ray calls (far), a call and a stream alike
(docs/decisions/0025-abandoned-work-grace-starts-at-abandonment.md).

The server keeps the default 300 s deadline with a 0.5 s hang grace. The restarted
actor is held at its load (``hold``) while the test looks: ``/ready`` is 503 naming the
model and why, a new request is 503 with ``Retry-After``, echo serves; released, the
model answers again. Every wait is far below the deadline.
"""

from __future__ import annotations

import socket
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.ray.cluster import RayCluster
from tests.support import ServerProcess, start_server, wait_until
from tests.support.observe import assert_restarting, model_metric

pytest.importorskip("ray")

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

SERVER_START_TIMEOUT_S = 180.0
WAIT_S = 60.0
GRACE_S = 0.5
NEAR = 'executor=ray&num_cpus=0&resources={"node_a":0.1}&max_restarts=4'
FAR = 'executor=ray&same_node=never&num_cpus=0&resources={"node_b":0.1}&max_restarts=4'
# Each case has a model of its own: (model, placement, whether it streams).
CASES = {
    "near-call": (NEAR, False),
    "near-stream": (NEAR, True),
    "far-call": (FAR, False),
    "far-stream": (FAR, True),
}


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("abandoned")


@pytest.fixture(scope="module")
def server(ray_cluster: RayCluster, files: Path) -> Iterator[ServerProcess]:
    models: list[str] = ["--model", "echo"]
    for model, (placement, _) in CASES.items():
        signals = "&".join(
            f"{key}={files / f'{model}-{key}'}" for key in ("started", "release", "hold")
        )
        models += [
            "--model",
            f"{model}=tests.support.models.ray_actors:Stuck?{placement}&{signals}",
        ]
    env = ray_cluster.env()
    env["ZEROSERVE_RUNTIME__HANG_GRACE_S"] = str(GRACE_S)
    srv = start_server(*models, "--request-timeout", "300", env=env, timeout=SERVER_START_TIMEOUT_S)
    yield srv
    assert srv.stop() == 0


def reclaimed(server: ServerProcess, model: str) -> float:
    return model_metric(server.url, "zeroserve_workers_reclaimed_total", model)


def request(model: str, stream: bool) -> bytes:
    accept = "Accept: text/event-stream\r\n" if stream else ""
    return (
        f"POST /v1/raw/{model} HTTP/1.1\r\nHost: 127.0.0.1\r\n{accept}Content-Length: 2\r\n\r\ngo"
    ).encode()


@pytest.mark.parametrize("model", list(CASES))
def test_actor_whose_client_left_is_reclaimed(
    server: ServerProcess, files: Path, model: str
) -> None:
    _, stream = CASES[model]
    started, release, hold = (files / f"{model}-{key}" for key in ("started", "release", "hold"))
    before = reclaimed(server, model)
    hold.touch()  # the restarted actor waits at its load until the test looks
    with socket.create_connection((server.host, server.port), timeout=WAIT_S) as client:
        client.sendall(request(model, stream))
        if stream:
            received = b""
            while b"first" not in received:
                chunk = client.recv(65536)
                assert chunk, received
                received += chunk
        wait_until(started.exists, WAIT_S, "the work to reach the actor's wait")
    # The client is gone; the request's deadline is 300 s away.
    wait_until(lambda: reclaimed(server, model) == before + 1, WAIT_S, "the actor reclaimed")
    assert_restarting(server.url, model, "1 of 1 Ray actors restarting")
    release.touch()  # the restarted actor's calls return
    hold.unlink()
    wait_until(
        lambda: httpx.get(f"{server.url}/ready", timeout=WAIT_S).status_code == 200,
        WAIT_S,
        "the restarted actor ready",
    )
    r = httpx.post(f"{server.url}/v1/raw/{model}", content=b"again", timeout=WAIT_S)
    assert (r.status_code, r.content) == (200, b"again")
