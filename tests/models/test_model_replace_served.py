"""Models at run time through a real ``zeroserve serve --models-dir`` process
(docs/models.md, "Replacing a loaded model" and "Models at run time"): a replaced model's
open streams finish on its old version while new requests get the new one, and the old
version's worker process exits; the raw and KServe V2 infer routes load an unloaded
catalog model on demand (httpx, tritonclient)."""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

from tests.support import ServerProcess, scaled, start_server, wait_until

# The longest a load of a test model may take on a loaded machine.
LOAD_WAIT_S = 60.0
STREAMS = 3


def _folder(root: Path, name: str, spec: str, options: str = "") -> None:
    folder = root / name
    folder.mkdir(exist_ok=True)
    text = f'spec = "{spec}"\n' + (f"[options]\n{options}" if options else "")
    (folder / "model.toml").write_text(text)


def _versioned(root: Path, version: str, hold: Path) -> None:
    options = f'version = "{version}"\nhold = "{hold}"\nexecutor = "process"\n'
    _folder(root, "v", "tests.support.models.engine:Versioned", options)


@pytest.fixture
def hold(tmp_path: Path) -> Path:
    return tmp_path / "hold"


@pytest.fixture
def models_dir(tmp_path: Path, hold: Path) -> Path:
    d = tmp_path / "models"
    d.mkdir()
    _versioned(d, "v1", hold)
    _folder(d, "twin", "echo")
    _folder(d, "twin2", "echo")
    return d


@pytest.fixture
def server(models_dir: Path) -> Iterator[ServerProcess]:
    s = start_server("--models-dir", str(models_dir), "--model", "echo")
    yield s
    assert s.stop() == 0


def _states(server: ServerProcess) -> dict[str, dict[str, Any]]:
    r = httpx.get(server.url + "/models")
    assert r.status_code == 200
    return {m["id"]: m["status"] for m in r.json()["data"]}


def _metric(server: ServerProcess, line_start: str) -> float:
    for line in httpx.get(server.url + "/metrics").text.splitlines():
        if line.startswith(line_start + " "):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"{line_start} is not in /metrics")


def _load(server: ServerProcess, name: str) -> None:
    r = httpx.post(server.url + "/models/load", json={"model": name}, timeout=scaled(LOAD_WAIT_S))
    assert r.status_code == 200 and r.json() == {"success": True}, r.text


def _alive(pid: int) -> bool:
    return Path(f"/proc/{pid}").exists()


def test_a_replaced_models_streams_finish_and_new_requests_get_the_new_version(
    server: ServerProcess, models_dir: Path, hold: Path
) -> None:
    url = server.url
    _load(server, "v")
    firsts: list[bytes] = []

    def stream(_: int) -> tuple[int, bytes]:
        with httpx.stream(
            "POST", url + "/v1/raw/v?stream=1", content=b"go", timeout=scaled(LOAD_WAIT_S)
        ) as r:
            chunks = r.iter_raw()
            first = next(chunks)
            firsts.append(first)
            return r.status_code, first + b"".join(chunks)

    with ThreadPoolExecutor(STREAMS) as pool:
        held = [pool.submit(stream, i) for i in range(STREAMS)]
        wait_until(lambda: len(firsts) == STREAMS, scaled(LOAD_WAIT_S), "the streams to start")
        assert len(set(firsts)) == 1
        old_version, old_pid = firsts[0].decode().strip().split("@")
        assert old_version == "v1" and _alive(int(old_pid))

        _versioned(models_dir, "v2", hold)
        assert httpx.post(url + "/v2/repository/index").status_code == 200
        _load(server, "v")  # the entry changed: a replace
        assert _states(server)["v"] == {"value": "loaded", "replacing": True}
        r = httpx.post(url + "/v1/raw/v", content=b"x")
        assert r.status_code == 200
        new_version, new_pid = r.content.decode().split("@")
        assert new_version == "v2" and new_pid != old_pid
        assert _alive(int(old_pid))  # still finishing its streams

        hold.touch()
        results = [f.result() for f in held]
    assert results == [(200, firsts[0] + b"done")] * STREAMS
    wait_until(
        lambda: _states(server)["v"] == {"value": "loaded"},
        scaled(LOAD_WAIT_S),
        "the old version to retire",
    )
    wait_until(lambda: not _alive(int(old_pid)), scaled(LOAD_WAIT_S), "the old worker to exit")
    assert _metric(server, 'zeroserve_model_loads_total{name="v"}') == 2.0
    _load(server, "v")  # unchanged now: nothing loads
    assert _metric(server, 'zeroserve_model_loads_total{name="v"}') == 2.0
    r = httpx.post(url + "/v1/raw/v", content=b"x")
    assert r.content.decode() == f"v2@{new_pid}"


def test_raw_and_v2_requests_load_an_unloaded_catalog_model(server: ServerProcess) -> None:
    tc = pytest.importorskip("tritonclient.http")
    url = server.url

    def raw(_: int) -> httpx.Response:
        return httpx.post(url + "/v1/raw/twin", content=b"hello", timeout=scaled(LOAD_WAIT_S))

    with ThreadPoolExecutor(4) as pool:
        answers = list(pool.map(raw, range(4)))
    assert [(r.status_code, r.content) for r in answers] == [(200, b"hello")] * 4
    assert _metric(server, 'zeroserve_model_loads_total{name="twin"}') == 1.0
    assert _states(server)["twin"] == {"value": "loaded"}
    r = httpx.post(url + "/v1/raw/nowhere", content=b"x")
    assert r.status_code == 404

    client = tc.InferenceServerClient(
        f"{server.host}:{server.port}", network_timeout=scaled(LOAD_WAIT_S)
    )
    try:
        assert not client.is_model_ready("twin2")
        data = np.arange(6, dtype=np.float32).reshape(2, 3)
        inp = tc.InferInput("INPUT0", list(data.shape), "FP32")
        inp.set_data_from_numpy(data, binary_data=True)
        result = client.infer("twin2", [inp])
        np.testing.assert_array_equal(result.as_numpy("INPUT0"), data)
        assert client.is_model_ready("twin2")
    finally:
        client.close()
    assert _metric(server, 'zeroserve_model_loads_total{name="twin2"}') == 1.0


def test_without_autoload_raw_and_v2_answer_404(models_dir: Path) -> None:
    server = start_server("--models-dir", str(models_dir), "--no-autoload")
    try:
        assert httpx.post(server.url + "/v1/raw/twin", content=b"x").status_code == 404
        r = httpx.post(server.url + "/v2/models/twin/infer", json={"inputs": []})
        assert r.status_code == 404 and "error" in r.json()
        assert _states(server)["twin"] == {"value": "unloaded"}
    finally:
        assert server.stop() == 0
