"""``executor="ray"`` on a real local Ray cluster of two nodes (see conftest): the same
bytes as the inline executor on every API, zero copy on the ingress's node, one counted
copy each way through the object store otherwise, and the fault paths."""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import socket
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

from tests.ray.cluster import RayCluster
from tests.support import ServerProcess, start_server, wait_until

pytest.importorskip("ray")

# Module-scoped Ray nodes and servers start in the first test: past the suite's 120 s.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

# Starting a server whose actors load on a busy two-core machine takes a while.
SERVER_START_TIMEOUT_S = 180.0
# Every wait on the server's state polls until this deadline.
WAIT_S = 60.0
CLIENT_TIMEOUT_S = 60.0
# Longer than a Ray stream's credit window (``producer.STREAM_WINDOW``, 64 pieces), so
# credit goes back to the actor several times within one stream.
STREAM_TOKENS = "300"
FAR = 'same_node=never&num_cpus=0&resources={"node_b":0.1}'
# The models of the hung-stream test, one per way its consumer goes: the deadline cuts
# the stream, or the client disconnects.
HUNG_STREAM_MODELS = ("hangs", "drops")
# The hung-stream test's request deadline (``?timeout=``), seconds: short, so the hang
# grace (the server's default) starts soon.
HUNG_STREAM_TIMEOUT = "1"
# Concurrent requests on the one-actor ``overlap`` model: more than its batch slots, so
# its actor always has a batch waiting behind the running one.
OVERLAP_REQUESTS = 12


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("signals")


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
def ray_server(ray_cluster: RayCluster, files: Path) -> Iterator[ServerProcess]:
    # Pinned to node a: unpinned, Ray's default (hybrid) scheduling packs actors on the
    # driver's node only up to half its CPUs and then spreads them, so a near model
    # could start on node b (seen once: test_the_far_models_run_on_node_b failed so).
    near = 'executor=ray&num_cpus=0.25&resources={"node_a":0.1}'
    stuck = f"started={files / 'started'}&release={files / 'release'}"
    hang = f"started={files / 'hang-started'}&release={files / 'hang-release'}"
    # The hung-stream models run beside the others on node a without taking its CPUs.
    aside = 'executor=ray&num_cpus=0&resources={"node_a":0.1}&max_restarts=4'
    hung_streams = [
        arg
        for model in HUNG_STREAM_MODELS
        for arg in (
            "--model",
            f"{model}=tests.support.models.ray_actors:Stuck?{aside}"
            f"&started={files / (model + '-started')}&release={files / (model + '-release')}",
        )
    ]
    server = start_server(
        "--model",
        f"echo?{near}",
        "--model",
        f"dbl=tests.support.models.ray_actors:Doubler?{near}",
        "--model",
        f"far=zeroserve.models.echo:EchoModel?executor=ray&{FAR}",
        "--model",
        f"fardbl=tests.support.models.ray_actors:Doubler?executor=ray&{FAR}",
        "--model",
        f"stuck=tests.support.models.ray_actors:Stuck?{near}&max_restarts=4&{stuck}",
        "--model",
        f"tick=tests.support.models.ray_actors:Ticker?{near}&closed={files / 'closed'}",
        "--model",
        f"hang=tests.support.models.ray_actors:Stuck?{near}&max_restarts=4&{hang}",
        "--model",
        f"overlap=tests.support.models.ray_actors:Overlap?{near}",
        *hung_streams,
        env=ray_cluster.env(),
        timeout=SERVER_START_TIMEOUT_S,
    )
    yield server
    assert server.stop() == 0


def _metric(server: ServerProcess, name: str, /, **labels: str) -> float:
    text = httpx.get(f"{server.url}/metrics", timeout=CLIENT_TIMEOUT_S).text
    want = ",".join(f'{k}="{v}"' for k, v in labels.items())
    total = 0.0
    for line in text.splitlines():
        m = re.match(r"^([a-z_]+)(?:\{(.*)\})? (\S+)$", line)
        if m and m.group(1) == name and all(p in (m.group(2) or "") for p in want.split(",")):
            total += float(m.group(3))
    return total


def _copies(server: ServerProcess) -> dict[str, float]:
    return {
        site: _metric(server, "zeroserve_copied_bytes_total", site=site)
        for site in ("ray_put", "ray_get", "ray_input", "ray_output")
    }


def _v2_binary(url: str, model: str, x: np.ndarray) -> tuple[dict[str, Any], bytes]:
    head = json.dumps(
        {
            "inputs": [
                {
                    "name": "x",
                    "shape": list(x.shape),
                    "datatype": "FP32",
                    "parameters": {"binary_data_size": x.nbytes},
                }
            ],
            "outputs": [{"name": "y", "parameters": {"binary_data": True}}],
        }
    ).encode()
    r = httpx.post(
        f"{url}/v2/models/{model}/infer",
        content=head + x.tobytes(),
        headers={
            "Inference-Header-Content-Length": str(len(head)),
            "Content-Type": "application/octet-stream",
        },
        timeout=CLIENT_TIMEOUT_S,
    )
    assert r.status_code == 200, r.text
    n = int(r.headers["Inference-Header-Content-Length"])
    meta = json.loads(r.content[:n])
    meta.pop("id", None)
    meta.pop("model_name")  # the rest of the head must match byte for byte
    return meta, r.content[n:]


def _raw(url: str, model: str, body: bytes, **params: str) -> httpx.Response:
    return httpx.post(
        f"{url}/v1/raw/{model}", content=body, params=params, timeout=CLIENT_TIMEOUT_S
    )


@contextlib.contextmanager
def _sse(url: str, model: str, **params: str) -> Iterator[httpx.Response]:
    """A raw stream of ``model`` as server-sent events, open while the block runs."""
    with (
        httpx.Client(timeout=CLIENT_TIMEOUT_S) as http,
        http.stream(
            "POST",
            f"{url}/v1/raw/{model}",
            content=b"go",
            params=params,
            headers={"Accept": "text/event-stream"},
        ) as r,
    ):
        yield r


def test_same_bytes_as_inline_and_zero_copy_on_the_same_node(
    inline_server: ServerProcess, ray_server: ServerProcess
) -> None:
    rng = np.random.default_rng(7)
    body = rng.integers(0, 256, 1 << 20, dtype=np.uint8).tobytes()
    x = rng.standard_normal((256, 1024), dtype=np.float32)  # 1 MiB
    text = b"the quick brown fox jumps over the lazy dog " * 8
    before = _copies(ray_server)
    for ray_model, inline_model in (("echo", "echo"), ("far", "echo")):
        got, want = (
            _raw(ray_server.url, ray_model, body),
            _raw(inline_server.url, inline_model, body),
        )
        assert got.status_code == want.status_code == 200
        assert got.content == want.content == body
        got = _raw(ray_server.url, ray_model, text, stream="1", max_tokens=STREAM_TOKENS)
        want = _raw(inline_server.url, inline_model, text, stream="1", max_tokens=STREAM_TOKENS)
        assert got.status_code == 200 and got.content == want.content and got.content
        if ray_model == "echo":
            assert _copies(ray_server) == before  # the near actor read the arena in place
    for ray_model in ("dbl", "fardbl"):
        assert _v2_binary(ray_server.url, ray_model, x) == _v2_binary(inline_server.url, "dbl", x)
    after = _copies(ray_server)
    # The near models' actors are reached through links, the far ones through Ray calls.
    for model, linked in (("echo", 1), ("dbl", 1), ("far", 0), ("fardbl", 0)):
        assert _metric(ray_server, "zeroserve_workers_linked", name=model) == linked, model
    # The near models copied nothing but dbl's output, written once into a lease.
    assert after["ray_input"] == before["ray_input"]
    assert after["ray_output"] - before["ray_output"] == x.nbytes
    # The far models: exactly one copy in and one out per request (raw + V2; the raw
    # stream's input goes in once too, its pieces are the stream itself).
    assert after["ray_put"] - before["ray_put"] == len(body) + len(text) + x.nbytes
    assert after["ray_get"] - before["ray_get"] == len(body) + x.nbytes


_WHERE = """
import json
nodes = {n["NodeID"]: sorted(n["Resources"]) for n in ray.nodes() if n["Alive"]}
def node(_self):
    return ray.get_runtime_context().get_node_id()
where = {}
for name in sys.argv[1:]:
    where[name] = nodes[ray.get(ray.get_actor(name).__ray_call__.remote(node))]
print(json.dumps(where))
"""


def test_the_far_models_run_on_node_b(ray_cluster: RayCluster, ray_server: ServerProcess) -> None:
    pid = ray_server.proc.pid
    names = [f"{pid}-{m}-0" for m in ("far", "fardbl", "echo", "dbl")]
    where = json.loads(ray_cluster.driver(_WHERE, *names).strip().splitlines()[-1])
    for model, on_b in (("far", True), ("fardbl", True), ("echo", False), ("dbl", False)):
        assert ("node_b" in where[f"{pid}-{model}-0"]) is on_b, where


def test_killed_actor_fails_in_flight_restarts_and_leaks_nothing(
    ray_cluster: RayCluster, ray_server: ServerProcess, files: Path
) -> None:
    started, release = files / "started", files / "release"
    name = f"{ray_server.proc.pid}-stuck-0"
    # A stream in flight on the actor is cut with an error event.
    with _sse(ray_server.url, "stuck") as r:
        assert r.status_code == 200
        lines = r.iter_lines()
        events: list[str] = []
        for line in lines:
            if line.startswith("data:"):
                events.append(line)
                break
        assert events == ["data: first"], events
        wait_until(started.exists, WAIT_S, "the stream to reach the actor's wait")
        ray_cluster.driver("ray.kill(ray.get_actor(sys.argv[1]), no_restart=False)", name)
        events += [line for line in lines if line.startswith("data:")]
    assert len(events) == 2, events
    assert "error" in json.loads(events[1][len("data:") :]), events
    wait_until(
        lambda: httpx.get(f"{ray_server.url}/ready").status_code == 200, WAIT_S, "the restart"
    )
    started.unlink()
    # An infer in flight gets 503.
    result: list[httpx.Response] = []
    client = threading.Thread(
        target=lambda: result.append(_raw(ray_server.url, "stuck", b"payload" * 1000))
    )
    client.start()
    wait_until(started.exists, WAIT_S, "the request to reach the actor")
    ray_cluster.driver("ray.kill(ray.get_actor(sys.argv[1]), no_restart=False)", name)
    client.join(WAIT_S)
    assert result and result[0].status_code == 503, result
    assert "error" in result[0].json()
    release.touch()
    wait_until(
        lambda: httpx.get(f"{ray_server.url}/ready").status_code == 200, WAIT_S, "the restart"
    )
    # The restarted actor is linked again (its new start's link socket).
    assert _metric(ray_server, "zeroserve_workers_linked", name="stuck") == 1
    r = _raw(ray_server.url, "stuck", b"after the restart")
    assert r.status_code == 200 and r.content == b"after the restart"
    assert _metric(ray_server, "zeroserve_arena_used_bytes") == 0
    assert _metric(ray_server, "zeroserve_arena_leases") == 0


def test_actor_hung_past_its_deadline_is_killed_restarted_and_counted(
    ray_cluster: RayCluster, ray_server: ServerProcess, files: Path
) -> None:
    """A call that never returns: 504 at its deadline, then its actor is reclaimed past
    the hang grace (killed, restarted by Ray, counted), and the model serves again."""
    reclaimed = _metric(ray_server, "zeroserve_workers_reclaimed_total", name="hang")
    restarts = _metric(ray_server, "zeroserve_workers_restarts_total", name="hang")
    r = _raw(ray_server.url, "hang", b"never returns", timeout="0.5")
    assert r.status_code == 504, r.text
    hung_pid = (files / "hang-started").read_text()  # it reached the actor's thread
    wait_until(
        lambda: (
            _metric(ray_server, "zeroserve_workers_reclaimed_total", name="hang") == reclaimed + 1
        ),
        WAIT_S,
        "the hung actor to be reclaimed",
    )
    wait_until(
        lambda: (
            _metric(ray_server, "zeroserve_workers_restarts_total", name="hang") == restarts + 1
        ),
        WAIT_S,
        "its restart",
    )
    assert httpx.get(f"{ray_server.url}/ready", timeout=CLIENT_TIMEOUT_S).status_code == 200
    (files / "hang-release").touch()  # the restarted actor's calls return
    r = _raw(ray_server.url, "hang", b"after the restart")
    assert r.status_code == 200 and r.content == b"after the restart"
    # served by the new process (a kill is asynchronous: the hung one answers a while)
    assert (files / "hang-started").read_text() != hung_pid
    assert _metric(ray_server, "zeroserve_arena_leases") == 0


@pytest.mark.parametrize("model", HUNG_STREAM_MODELS)
def test_stream_hung_past_its_deadline_is_reclaimed_restarted_and_counted(
    ray_server: ServerProcess, files: Path, model: str
) -> None:
    """A stream whose step never returns: its consumer goes (the deadline cuts it, or
    the client disconnects), and past the deadline plus the hang grace its actor is
    reclaimed (killed, restarted by Ray, counted); a new process serves afterwards."""
    started, release = files / f"{model}-started", files / f"{model}-release"
    reclaimed = _metric(ray_server, "zeroserve_workers_reclaimed_total", name=model)
    restarts = _metric(ray_server, "zeroserve_workers_restarts_total", name=model)
    with _sse(ray_server.url, model, timeout=HUNG_STREAM_TIMEOUT) as r:
        assert r.status_code == 200
        events = []
        for line in r.iter_lines():
            if line.startswith("data:"):
                events.append(line)
                if model == "drops":
                    break  # the client goes away with the step hung
        wait_until(started.exists, WAIT_S, "the stream to reach the step that never returns")
    if model == "hangs":  # the deadline cut the stream with an error event
        assert events[0] == "data: first" and len(events) == 2, events
        assert "error" in json.loads(events[1][len("data:") :]), events
    hung_pid = started.read_text()
    wait_until(
        lambda: (
            _metric(ray_server, "zeroserve_workers_reclaimed_total", name=model) == reclaimed + 1
        ),
        WAIT_S,
        "the hung stream's actor to be reclaimed",
    )
    wait_until(
        lambda: _metric(ray_server, "zeroserve_workers_restarts_total", name=model) == restarts + 1,
        WAIT_S,
        "its restart",
    )
    wait_until(
        lambda: httpx.get(f"{ray_server.url}/ready").status_code == 200, WAIT_S, "/ready again"
    )
    release.touch()  # the restarted actor's calls return
    r = _raw(ray_server.url, model, b"after the restart")
    assert r.status_code == 200 and r.content == b"after the restart"
    assert started.read_text() != hung_pid  # served by the new process
    assert _metric(ray_server, "zeroserve_arena_used_bytes") == 0
    assert _metric(ray_server, "zeroserve_arena_leases") == 0


def _link_sockets() -> set[str]:
    """The abstract Unix sockets of the actors' links listening on this machine."""
    names = set()
    for line in Path("/proc/net/unix").read_text().splitlines()[1:]:
        fields = line.split()
        if len(fields) >= 8 and fields[7].startswith("@zeroserve-link-"):
            names.add("\0" + fields[7][1:])
    return names


def test_a_link_socket_serves_the_ingress_alone(ray_server: ServerProcess) -> None:
    """Anyone else who connects to an actor's link socket (here: this test, with a made-up
    token) is closed on without an answer, and the model keeps serving."""
    from zeroserve.runtime.worker import wire

    sockets = _link_sockets()
    assert sockets, "the near actors' link sockets should be listening"
    for address in sockets:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.settimeout(CLIENT_TIMEOUT_S)
            sock.connect(address)
            sock.sendall(wire.frame(wire.Link(b"\x00" * 16)))
            assert sock.recv(64) == b"", address  # closed: no Ready, no worker protocol
    assert _raw(ray_server.url, "echo", b"still served").content == b"still served"


def test_disconnect_mid_stream_stops_the_actors_generator(
    ray_server: ServerProcess, files: Path
) -> None:
    closed = files / "closed"
    with (
        httpx.Client(timeout=CLIENT_TIMEOUT_S) as client,
        client.stream("POST", f"{ray_server.url}/v1/raw/tick", content=b"go") as r,
    ):
        assert r.status_code == 200
        got = b""
        for chunk in r.iter_raw():
            got += chunk
            if len(got) > 64:
                break
    wait_until(closed.exists, WAIT_S, "the actor's generator to close")
    produced = int(closed.read_text())
    assert produced >= len(got.split())  # it stopped: a finite count was written


def test_pipelined_batches_reach_the_model_one_at_a_time(ray_server: ServerProcess) -> None:
    """One actor takes several batches in flight (``roster.PIPELINE_DEPTH``), and its
    model still runs them in turn, as a process worker's would: no answer saw another
    ``infer`` running beside its own."""

    async def burst() -> list[httpx.Response]:
        async with httpx.AsyncClient(timeout=CLIENT_TIMEOUT_S) as client:
            return await asyncio.gather(
                *(
                    client.post(f"{ray_server.url}/v1/raw/overlap", content=b"x")
                    for _ in range(OVERLAP_REQUESTS)
                )
            )

    answers = asyncio.run(burst())
    assert [r.status_code for r in answers] == [200] * OVERLAP_REQUESTS
    assert {r.content for r in answers} == {b"1"}, [r.content for r in answers]


def test_bad_placement_options_fail_the_load_naming_the_option() -> None:
    from zeroserve.errors import ModelLoadError
    from zeroserve.models.echo import EchoModel
    from zeroserve.runtime import Engine, ModelConfig

    async def load(cfg: ModelConfig) -> None:
        engine = Engine({"m": cfg})
        try:
            await engine.start()
        finally:
            await engine.aclose()

    cases: list[tuple[Any, dict[str, Any], str]] = [
        ("ray", {"num_cpus": -1}, "num_cpus"),
        ("ray", {"same_node": "sometimes"}, "same_node"),
        ("ray", {"resources": "[1]"}, "resources"),
        ("ray", {"max_restarts": -2}, "max_restarts"),
        ("ray", {"colour": "red"}, "colour"),
        ("process", {"num_gpus": 1}, "need executor=ray"),
    ]
    for executor, placement, named in cases:
        cfg = ModelConfig(name="m", factory=EchoModel, executor=executor, placement=placement)
        with pytest.raises(ModelLoadError, match=named):
            asyncio.run(load(cfg))
