"""``executor="ray-serve"`` on the real local two-node Ray cluster (see conftest): Serve
runs without its HTTP proxy, answers (streams included) are byte-identical to the inline
executor's with zero copy on the ingress's node and one counted copy each way from the
other node, a client that disconnects mid-stream stops the replica's generator, an
autoscaling deployment goes up to ``max_replicas`` under a bounded burst and back
down once it ends, with no request lost, and a replica's death shows in ``/ready``
until Serve has replaced it."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest

from tests.ray.cluster import RayCluster
from tests.ray.test_ray_executor import WAIT_S, _copies, _metric, _raw, _sse, _v2_binary
from tests.support import ServerProcess, scaled, start_server, wait_until

pytest.importorskip("ray.serve")

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

SERVER_START_TIMEOUT_S = 240.0
CLIENT_TIMEOUT_S = 60.0
# Longer than a Ray stream's credit window (``producer.STREAM_WINDOW``, 64 pieces), so
# credit goes back to the actor several times within one stream.
STREAM_TOKENS = "300"
# Upscaling needs Serve to see the burst (metrics every 0.5 s over a 1 s window) and a
# replica to start on two busy cores; downscaling waits downscale_delay_s after that.
SCALE_WAIT_S = 120.0
# The burst: this many clients, each sending at most BURST_MAX requests, until the
# deployment reached max_replicas.
BURST_CLIENTS = 6
BURST_MAX = 600
NEAR = 'executor=ray-serve&num_cpus=0&resources={"node_a":0.1}'
FAR = 'executor=ray-serve&same_node=never&num_cpus=0&resources={"node_b":0.1}'
ELASTIC = (
    "min_replicas=1&max_replicas=2&target_ongoing_requests=1&upscale_delay_s=0.5"
    "&downscale_delay_s=2&look_back_period_s=1&metrics_interval_s=0.5"
)


@pytest.fixture(scope="module")
def inline_server() -> Iterator[ServerProcess]:
    server = start_server(
        "--model",
        "echo",
        "--model",
        "dbl=tests.support.models.ray_actors:Doubler",
        timeout=SERVER_START_TIMEOUT_S,
    )
    yield server
    server.stop()


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("serve-signals")


@pytest.fixture(scope="module")
def serve_server(ray_cluster: RayCluster, files: Path) -> Iterator[ServerProcess]:
    server = start_server(
        "--model",
        f"echo?{NEAR}",
        "--model",
        f"dbl=tests.support.models.ray_actors:Doubler?{NEAR}",
        "--model",
        f"far=zeroserve.models.echo:EchoModel?{FAR}",
        "--model",
        f"fardbl=tests.support.models.ray_actors:Doubler?{FAR}",
        "--model",
        f"slow=tests.support.models.ray_actors:Slow?{NEAR}&delay_ms=200&{ELASTIC}",
        "--model",
        f"tick=tests.support.models.ray_actors:Ticker?{NEAR}&closed={files / 'closed'}",
        "--model",
        f"frail=tests.support.models.ray_actors:Stuck?{NEAR}"
        f"&started={files / 'frail-started'}&release={files / 'frail-release'}"
        f"&hold={files / 'frail-hold'}",
        env=ray_cluster.env(),
        timeout=SERVER_START_TIMEOUT_S,
    )
    yield server
    assert server.stop() == 0


_STATUS = """
import json
from ray import serve
s = serve.status()
apps = {
    name: {d: dict(st.replica_states) for d, st in app.deployments.items()}
    for name, app in s.applications.items()
}
print(json.dumps({"proxies": {k: str(v) for k, v in s.proxies.items()}, "apps": apps}))
"""


def _status(cluster: RayCluster) -> dict[str, dict[str, dict[str, dict[str, int]]]]:
    out: dict[str, dict[str, dict[str, dict[str, int]]]] = json.loads(
        cluster.driver(_STATUS).strip().splitlines()[-1]
    )
    return out


def _running(cluster: RayCluster, server: ServerProcess, model: str) -> int:
    app = _status(cluster)["apps"][f"zeroserve-{server.proc.pid}-{model}"]
    return int(app[model].get("RUNNING", 0))


def test_same_bytes_as_inline_no_proxy_and_the_copy_rule(
    ray_cluster: RayCluster, inline_server: ServerProcess, serve_server: ServerProcess
) -> None:
    rng = np.random.default_rng(11)
    body = rng.integers(0, 256, 1 << 20, dtype=np.uint8).tobytes()
    x = rng.standard_normal((256, 1024), dtype=np.float32)  # 1 MiB
    before = _copies(serve_server)
    got = _raw(serve_server.url, "echo", body)
    assert got.status_code == 200 and got.content == _raw(inline_server.url, "echo", body).content
    assert _copies(serve_server) == before  # the near replica read the arena in place
    got = _raw(serve_server.url, "far", body)
    assert got.status_code == 200 and got.content == body
    for model in ("dbl", "fardbl"):
        assert _v2_binary(serve_server.url, model, x) == _v2_binary(inline_server.url, "dbl", x)
    after = _copies(serve_server)
    # dbl's output is new memory on the replica: it comes back once through Serve.
    # far and fardbl: one copy in and one out each.
    assert after["ray_input"] == before["ray_input"]
    assert after["ray_put"] - before["ray_put"] == len(body) + x.nbytes
    assert after["ray_get"] - before["ray_get"] == len(body) + 2 * x.nbytes
    # Streams through the handle: the inline executor's bytes, near and far (the far
    # replica's raw input is one more counted copy in).
    text = b"the quick brown fox jumps over the lazy dog " * 8
    want = _raw(inline_server.url, "echo", text, stream="1", max_tokens=STREAM_TOKENS)
    assert want.status_code == 200 and want.content
    for model in ("echo", "far"):
        got = _raw(serve_server.url, model, text, stream="1", max_tokens=STREAM_TOKENS)
        assert got.status_code == 200 and got.content == want.content, model
    assert _copies(serve_server)["ray_put"] - after["ray_put"] == len(text)
    # Serve's own HTTP proxy never started, and the applications have no route.
    status = _status(ray_cluster)
    assert status["proxies"] == {}
    assert f"zeroserve-{serve_server.proc.pid}-echo" in status["apps"]


def test_burst_scales_up_to_max_then_down_with_no_request_lost(
    ray_cluster: RayCluster, serve_server: ServerProcess
) -> None:
    assert _running(ray_cluster, serve_server, "slow") == 1
    stop = threading.Event()
    sent = [0] * BURST_CLIENTS
    bad: list[str] = []

    def client(i: int) -> None:
        body = f"request from client {i}".encode()
        with httpx.Client(timeout=CLIENT_TIMEOUT_S) as http:
            while not stop.is_set() and sent[i] < BURST_MAX:
                sent[i] += 1
                r = http.post(f"{serve_server.url}/v1/raw/slow", content=body)
                if r.status_code != 200 or r.content != body:
                    bad.append(f"{r.status_code} {r.content[:200]!r}")

    threads = [threading.Thread(target=client, args=(i,)) for i in range(BURST_CLIENTS)]
    for t in threads:
        t.start()
    try:
        deadline = time.monotonic() + scaled(SCALE_WAIT_S)
        peak = 1
        while time.monotonic() < deadline and peak < 2 and any(t.is_alive() for t in threads):
            peak = max(peak, _running(ray_cluster, serve_server, "slow"))
    finally:
        stop.set()
        for t in threads:
            t.join(CLIENT_TIMEOUT_S)
    assert peak == 2, "the deployment did not scale up to max_replicas under the burst"
    assert not bad, bad[:5]  # every request of the burst answered, with its own bytes
    assert sum(sent) > 0
    deadline = time.monotonic() + scaled(SCALE_WAIT_S)
    now = 2
    while time.monotonic() < deadline and now > 1:
        now = _running(ray_cluster, serve_server, "slow")
    assert now == 1, "the deployment did not scale back down to min_replicas"
    r = _raw(serve_server.url, "slow", b"after")
    assert r.status_code == 200 and r.content == b"after"


def test_disconnect_mid_stream_stops_the_replicas_generator(
    serve_server: ServerProcess, files: Path
) -> None:
    closed = files / "closed"
    with (
        httpx.Client(timeout=CLIENT_TIMEOUT_S) as client,
        client.stream("POST", f"{serve_server.url}/v1/raw/tick", content=b"go") as r,
    ):
        assert r.status_code == 200
        got = b""
        for chunk in r.iter_raw():
            got += chunk
            if len(got) > 64:
                break
    wait_until(closed.exists, WAIT_S, "the replica's generator to close")
    assert int(closed.read_text()) >= len(got.split())  # it stopped: a finite count


_KILL_REPLICAS = """
from ray.util import list_named_actors
prefix = "SERVE_REPLICA::" + sys.argv[1] + "#"
names = [a["name"] for a in list_named_actors(all_namespaces=True) if a["name"].startswith(prefix)]
for name in names:
    ray.kill(ray.get_actor(name, namespace="serve"), no_restart=True)
print(len(names))
"""


def _ready(server: ServerProcess) -> int:
    return httpx.get(f"{server.url}/ready", timeout=CLIENT_TIMEOUT_S).status_code


def test_a_dead_replica_fails_its_work_and_unreadies_until_serve_replaces_it(
    ray_cluster: RayCluster, serve_server: ServerProcess, files: Path
) -> None:
    started, release, hold = (files / f"frail-{f}" for f in ("started", "release", "hold"))
    wait_until(lambda: _ready(serve_server) == 200, WAIT_S, "the server to be ready")
    assert _metric(serve_server, "zeroserve_workers_ready", name="frail") == 1
    result: list[httpx.Response] = []
    client = threading.Thread(
        target=lambda: result.append(_raw(serve_server.url, "frail", b"in flight"))
    )
    with _sse(serve_server.url, "frail") as r:
        # A stream and an infer in flight on the one replica (min_replicas=1).
        assert r.status_code == 200
        lines = r.iter_lines()
        events = [next(line for line in lines if line.startswith("data:"))]
        assert events == ["data: first"], events
        wait_until(started.exists, WAIT_S, "the stream to reach the replica's wait")
        dead_pid = started.read_text()
        started.unlink()
        client.start()
        wait_until(started.exists, WAIT_S, "the infer to reach the replica")
        # The replacement's load waits while ``hold`` exists, so the window in which
        # the deployment has no running replica lasts until the test ends it (Serve
        # replaced a replica in about 2 s here, near the status read interval).
        hold.touch()
        app = f"zeroserve-{serve_server.proc.pid}-frail"
        killed = ray_cluster.driver(_KILL_REPLICAS, app).strip().splitlines()[-1]
        assert killed == "1", killed
        events += [line for line in lines if line.startswith("data:")]
    assert len(events) == 2 and "error" in json.loads(events[1][len("data:") :]), events
    client.join(CLIENT_TIMEOUT_S)
    assert result and result[0].status_code == 503, result
    assert "error" in result[0].json()
    # Serve notices the death at its next health check and starts a replacement.
    wait_until(lambda: _ready(serve_server) == 503, WAIT_S, "/ready to show the dead replica")
    assert httpx.get(f"{serve_server.url}/health", timeout=CLIENT_TIMEOUT_S).status_code == 200
    wait_until(
        lambda: _metric(serve_server, "zeroserve_workers_ready", name="frail") == 0,
        WAIT_S,
        "no running replica in the statistics",
    )
    assert _ready(serve_server) == 503  # still: the replacement is loading
    hold.unlink()
    wait_until(lambda: _ready(serve_server) == 200, WAIT_S, "Serve to replace the replica")
    assert _metric(serve_server, "zeroserve_workers_ready", name="frail") == 1
    release.touch()  # the new replica's calls return
    r = _raw(serve_server.url, "frail", b"after the replacement")
    assert r.status_code == 200 and r.content == b"after the replacement"
    assert started.read_text() != dead_pid  # a new replica process served it
    assert _metric(serve_server, "zeroserve_arena_used_bytes") == 0
    assert _metric(serve_server, "zeroserve_arena_leases") == 0
