"""Models at run time through a real server (docs/architecture.md, "Models at run time"):
a ``zeroserve serve --models-dir`` process whose directory holds SmolLM2's GGUF (linked),
a corrupt GGUF and a ``model.toml`` folder, driven by the clients people use: the openai
SDK (autoload and its errors), httpx (llama.cpp router's routes) and tritonclient.http
(the KServe V2 repository extension)."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from tests.support import ServerProcess, model_scaled, scaled, start_server, wait_until

pytest.importorskip("xllamacpp")

from zeroserve.models.llamacpp import smollm2_path

CHAT = [{"role": "user", "content": "Say hi"}]
# The longest a load of SmolLM2 may take on a loaded machine (it takes about a second).
# Its load and its decode run on niced threads, which a busy machine slows far more than
# the suite: the tests that wait on them are marked ``niced`` and bound those waits by
# model_scaled (docs/decisions/0055-model-waits-scaled-for-the-niced-share.md).
LOAD_WAIT_S = 60.0


def _models_dir(root: Path) -> Path:
    d = root / "models"
    d.mkdir()
    (d / "small.gguf").symlink_to(smollm2_path())
    (d / "bad.gguf").write_bytes(b"this is not a GGUF file")
    twin = d / "twin"
    twin.mkdir()
    (twin / "model.toml").write_text('spec = "echo"\n')
    return d


@pytest.fixture
def models_dir(tmp_path: Path) -> Path:
    return _models_dir(tmp_path)


@pytest.fixture
def server(models_dir: Path) -> Iterator[ServerProcess]:
    s = start_server("--models-dir", str(models_dir), "--model", "echo")
    yield s
    assert s.stop() == 0


def _client(server: ServerProcess, timeout: float | None = None) -> openai.OpenAI:
    """An SDK client; ``timeout`` defaults to a scaled LOAD_WAIT_S (pass a model_scaled
    one where SmolLM2 answers)."""
    return openai.OpenAI(
        base_url=server.url + "/v1",
        api_key="none",
        max_retries=0,
        timeout=scaled(LOAD_WAIT_S) if timeout is None else timeout,
    )


def _states(server: ServerProcess) -> dict[str, dict[str, Any]]:
    r = httpx.get(server.url + "/models")
    assert r.status_code == 200
    return {m["id"]: m["status"] for m in r.json()["data"]}


def _metric(server: ServerProcess, line_start: str) -> float:
    text = httpx.get(server.url + "/metrics").text
    for line in text.splitlines():
        if line.startswith(line_start + " "):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"{line_start} is not in /metrics")


@pytest.mark.niced
def test_the_catalog_is_listed_and_concurrent_requests_share_one_load(
    server: ServerProcess,
) -> None:
    listed = _client(server).models.list().data
    status = {m.id: m.model_extra["status"] for m in listed if m.model_extra}  # type: ignore[index]
    assert status == {
        "echo": {"value": "loaded"},
        "bad": {"value": "unloaded"},
        "small": {"value": "unloaded"},
        "twin": {"value": "unloaded"},
    }
    assert httpx.get(server.url + "/ready").status_code == 200  # nothing unloaded counts

    def ask(_: int) -> str:
        small = _client(server, model_scaled(LOAD_WAIT_S))
        answer = small.chat.completions.create(model="small", messages=CHAT, max_tokens=4)
        return answer.choices[0].message.content or ""

    with ThreadPoolExecutor(4) as pool:
        answers = list(pool.map(ask, range(4)))
    assert all(answers)
    assert _metric(server, 'zeroserve_model_loads_total{name="small"}') == 1.0
    assert _metric(server, 'zeroserve_model_loaded{name="small"}') == 1.0
    assert _metric(server, 'zeroserve_model_load_seconds_count{model="small"}') == 1.0
    card = _client(server).models.retrieve("small").model_dump()
    assert card["status"] == {"value": "loaded"} and card["capabilities"]["chat"] is True
    assert httpx.get(server.url + "/ready").status_code == 200


def test_a_corrupt_file_fails_with_its_reason_while_the_others_serve(
    server: ServerProcess, models_dir: Path
) -> None:
    client = _client(server)
    with pytest.raises(openai.APIStatusError) as info:
        client.chat.completions.create(model="bad", messages=CHAT, max_tokens=2)
    err = info.value
    assert err.status_code == 503 and float(err.response.headers["retry-after"]) >= 1
    assert "not a GGUF file" in err.message and "'bad' could not be loaded" in err.message
    # The reason names the file, never where the server keeps it (the log has the path).
    assert str(models_dir) not in err.message and "bad.gguf" in err.message
    # Within the retry backoff the reason comes back at once, without a second load.
    with pytest.raises(openai.APIStatusError, match="not a GGUF file"):
        client.chat.completions.create(model="bad", messages=CHAT, max_tokens=2)
    assert _metric(server, 'zeroserve_model_failed_loads_total{name="bad"}') == 1.0
    status = _states(server)["bad"]
    assert status["value"] == "unloaded" and status["failed"] is True
    assert "not a GGUF file" in status["reason"] and str(models_dir) not in status["reason"]
    answer = client.chat.completions.create(model="twin", messages=CHAT, max_tokens=2)
    assert answer.choices[0].message.content
    assert client.embeddings.create(model="echo", input="still here").data


def test_the_router_routes_load_and_unload_catalog_models_only(server: ServerProcess) -> None:
    url = server.url
    r = httpx.post(url + "/models/load", json={"model": "twin"}, timeout=scaled(LOAD_WAIT_S))
    assert r.status_code == 200 and r.json() == {"success": True}
    assert _states(server)["twin"] == {"value": "loaded"}
    r = httpx.post(url + "/models/unload", json={"model": "twin"})
    assert r.status_code == 200 and r.json() == {"success": True}
    assert _states(server)["twin"] == {"value": "unloaded"}

    r = httpx.post(url + "/models/load", json={"model": "nowhere"})
    assert r.status_code == 404
    assert r.json()["error"]["code"] == "model_not_found"
    assert "'nowhere'" in r.json()["error"]["message"]
    r = httpx.post(url + "/models/load", json={"model": str(smollm2_path())})
    assert r.status_code == 404  # a path is a name like any other: never opened
    r = httpx.post(url + "/models/load", json={"model": "twin", "path": "/etc/passwd"})
    assert r.status_code == 400 and r.json()["error"]["param"] == "path"
    r = httpx.post(url + "/models/unload", json={"model": "echo"})
    assert r.status_code == 409 and r.json()["error"]["code"] == "model_pinned"
    r = httpx.post(url + "/models/load", json={"model": "bad"}, timeout=scaled(LOAD_WAIT_S))
    assert r.status_code == 500 and r.json()["error"]["code"] == "model_load_failed"
    assert "not a GGUF file" in r.json()["error"]["message"]
    assert "/models/bad.gguf" not in r.json()["error"]["message"]
    assert _states(server)["echo"] == {"value": "loaded"}


def test_tritonclient_drives_the_repository_extension(server: ServerProcess) -> None:
    tc = pytest.importorskip("tritonclient.http")
    from tritonclient.utils import InferenceServerException

    client = tc.InferenceServerClient(
        f"{server.host}:{server.port}", network_timeout=scaled(LOAD_WAIT_S)
    )
    try:
        index = {m["name"]: m for m in client.get_model_repository_index()}
        assert index["echo"]["state"] == "READY" and index["twin"]["state"] == "UNAVAILABLE"
        client.load_model("twin")
        assert client.is_model_ready("twin")
        assert {m["name"] for m in client.get_model_repository_index()} >= {"twin", "small"}
        client.unload_model("twin")
        assert not client.is_model_ready("twin")
        with pytest.raises(InferenceServerException, match="'nowhere' is not in the catalog"):
            client.load_model("nowhere")
        with pytest.raises(InferenceServerException, match="config"):
            client.load_model("twin", config='{"backend": "python"}')
        with pytest.raises(InferenceServerException, match="not a GGUF file"):
            client.load_model("bad")
        index = {m["name"]: m for m in client.get_model_repository_index()}
        assert index["bad"]["state"] == "UNAVAILABLE" and "GGUF" in index["bad"]["reason"]
    finally:
        client.close()


def test_only_admin_keys_may_control_models(tmp_path: Path) -> None:
    keys = tmp_path / "keys.toml"
    keys.write_text('[keys.ops]\nkey = "sk-ops"\nadmin = true\n\n[keys.app]\nkey = "sk-app"\n')
    server = start_server("--models-dir", str(_models_dir(tmp_path)), "--api-keys-file", str(keys))
    try:
        url, body = server.url, {"model": "twin"}
        r = httpx.post(url + "/models/load", json=body, headers={"authorization": "Bearer sk-app"})
        assert r.status_code == 403
        assert r.json()["error"]["code"] == "permission_denied"
        r = httpx.post(
            url + "/v2/repository/models/twin/load", headers={"authorization": "Bearer sk-app"}
        )
        assert r.status_code == 403 and "admin" in r.json()["error"]
        assert httpx.post(url + "/models/load", json=body).status_code == 401
        r = httpx.post(url + "/models/load", json=body, headers={"authorization": "Bearer sk-ops"})
        assert r.status_code == 200 and r.json() == {"success": True}
        # Everyone may list: the same as /v1/models.
        r = httpx.get(url + "/models", headers={"authorization": "Bearer sk-app"})
        assert {m["id"]: m["status"]["value"] for m in r.json()["data"]}["twin"] == "loaded"
    finally:
        assert server.stop() == 0


def test_sighup_rescans_the_directory(server: ServerProcess, models_dir: Path) -> None:
    httpx.post(server.url + "/models/load", json={"model": "twin"}).raise_for_status()
    (models_dir / "bad.gguf").unlink()
    extra = models_dir / "extra"
    extra.mkdir()
    (extra / "model.toml").write_text('spec = "echo"\npin = true\n')
    server.proc.send_signal(signal.SIGHUP)
    wait_until(lambda: "extra" in _states(server), 30, "the rescan to add 'extra'")
    states = _states(server)
    assert "bad" not in states and states["twin"] == {"value": "loaded"}
    answer = _client(server).embeddings.create(model="extra", input="new")
    assert answer.data
    # The same through the KServe route: the folder gone, its model leaves.
    for path in extra.iterdir():
        path.unlink()
    extra.rmdir()
    r = httpx.post(server.url + "/v2/repository/index")
    assert r.status_code == 200 and "extra" not in {m["name"] for m in r.json()}


def test_an_idle_model_is_unloaded_after_its_keep_alive(models_dir: Path) -> None:
    server = start_server("--models-dir", str(models_dir), "--keep-alive", "0")
    try:
        answer = _client(server).embeddings.create(model="twin", input="once")
        assert answer.data
        wait_until(lambda: _states(server)["twin"] == {"value": "unloaded"}, 30, "the idle unload")
        assert _metric(server, 'zeroserve_model_unloads_total{name="twin"}') == 1.0
    finally:
        assert server.stop() == 0


def test_without_autoload_a_request_does_not_load(models_dir: Path) -> None:
    server = start_server("--models-dir", str(models_dir), "--no-autoload")
    try:
        with pytest.raises(openai.NotFoundError):
            _client(server).embeddings.create(model="twin", input="x")
        assert _states(server)["twin"] == {"value": "unloaded"}
    finally:
        assert server.stop() == 0


def _process_footprint(pid: int) -> tuple[int, int, list[int]]:
    proc = Path(f"/proc/{pid}")
    children = sorted(
        int(p.name) for p in Path("/proc").iterdir() if p.name.isdigit() and _ppid(p) == pid
    )
    return len(os.listdir(proc / "fd")), len(os.listdir(proc / "task")), children


def _ppid(proc: Path) -> int:
    try:
        return int((proc / "stat").read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return -1


CYCLES = 6


# SmolLM2's loads are a second each on a quiet machine, many on a shared one.
@pytest.mark.niced
@pytest.mark.timeout(600)
def test_load_unload_cycles_leave_fds_threads_and_processes_as_they_were(
    server: ServerProcess,
) -> None:
    url = server.url
    with httpx.Client(timeout=model_scaled(LOAD_WAIT_S)) as http:

        def cycle() -> None:
            for name in ("small", "twin"):
                assert http.post(url + "/models/load", json={"model": name}).status_code == 200
                r = http.post(
                    url + "/v1/chat/completions",
                    json={"model": name, "messages": CHAT, "max_tokens": 2},
                )
                assert r.status_code == 200
                assert http.post(url + "/models/unload", json={"model": name}).status_code == 200

        cycle()  # warm: the first load's one-time allocations (thread pools, imports)
        before = _process_footprint(server.proc.pid)
        for _ in range(CYCLES):
            cycle()
        after = _process_footprint(server.proc.pid)
    fds, threads, children = after
    # Pool threads may end while idle; none is left behind by an unload.
    assert (fds, children) == (before[0], before[2]) and threads <= before[1]
    assert _metric(server, 'zeroserve_model_loads_total{name="small"}') == CYCLES + 1


def test_the_models_command_lists_a_catalog_and_a_servers_states(
    server: ServerProcess, models_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from zeroserve.cli import main

    assert main(["models", "--models-dir", str(models_dir), "--model", "echo"]) == 0
    rows = {line.split()[0]: line for line in capsys.readouterr().out.splitlines()}
    assert sorted(rows) == ["bad", "echo", "small", "twin"]
    assert "at start" in rows["echo"] and "on demand" in rows["small"]
    httpx.post(server.url + "/models/load", json={"model": "bad"}, timeout=scaled(LOAD_WAIT_S))
    assert main(["models", "--url", server.url]) == 0
    rows = {line.split()[0]: line.split() for line in capsys.readouterr().out.splitlines()}
    assert rows["echo"] == ["echo", "loaded", "pinned"]
    assert rows["small"] == ["small", "unloaded"]
    assert rows["bad"][1] == "failed" and "GGUF" in " ".join(rows["bad"])
