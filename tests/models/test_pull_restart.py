"""Pulled models survive a restart (docs/models.md, "Pulled models in the catalog"): real
``zeroserve serve`` processes on one ``ZEROSERVE_CACHE``, the loopback hub and httpx. A
model pulled through the API is in the next server's catalog, unloaded, served offline on
request; ``zeroserve rm`` and a rescan take it out; a server with only ``--model`` specs
does not serve the cache."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.support import scaled, server_env, start_server
from tests.support.hub import REPO, LoopbackHub, loopback_hub
from zeroserve.models.llamacpp import SMOLLM2_FILE, SMOLLM2_SHA256

pytest.importorskip("xllamacpp")
pytest.importorskip("huggingface_hub")

SOURCE = f"hf:{REPO}:{SMOLLM2_FILE}?sha256={SMOLLM2_SHA256}"
NAME = SMOLLM2_FILE.removesuffix(".gguf")  # the cache's name for it, as `zeroserve list`'s
# The longest a pull (a loopback copy) and a load of SmolLM2 may take on a loaded machine.
WAIT_S = 120.0


@pytest.fixture
def hub() -> Iterator[LoopbackHub]:
    with loopback_hub() as server:
        yield server


def _statuses(url: str) -> dict[str, Any]:
    listing = httpx.get(url + "/v1/models", timeout=scaled(30)).json()["data"]
    return {m["id"]: m["status"] for m in listing}


def _chat(url: str, model: str) -> httpx.Response:
    body = {"model": model, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4}
    return httpx.post(url + "/v1/chat/completions", json=body, timeout=scaled(WAIT_S))


@pytest.mark.niced
def test_a_pulled_model_is_served_after_a_restart_until_it_is_removed(
    hub: LoopbackHub, tmp_path: Path
) -> None:
    env = {"HF_ENDPOINT": hub.url, "ZEROSERVE_CACHE": str(tmp_path / "cache")}
    # A server that may pull: the pull enters its catalog under the cache's name.
    first = start_server("--model", "echo", "--allow-pull", env=env)
    try:
        pull = {"model": SOURCE}
        r = httpx.post(first.url + "/models/pull", json=pull, timeout=scaled(WAIT_S))
        assert r.status_code == 200, r.text
        assert r.json() == {"success": True, "model": NAME}
        assert _statuses(first.url)[NAME] == {"value": "unloaded"}
        # Pulled again: the file is the catalog's already; success, nothing doubled.
        r = httpx.post(first.url + "/models/pull", json=pull, timeout=scaled(WAIT_S))
        assert r.status_code == 200 and r.json()["model"] == NAME, r.text
        assert sorted(_statuses(first.url)) == sorted(["echo", NAME])
    finally:
        assert first.stop() == 0
    fetched = list(hub.log)

    # A server with only --model specs: the shared cache stays out of its catalog.
    plain = start_server("--model", "echo", env=env)
    try:
        assert list(_statuses(plain.url)) == ["echo"]
    finally:
        assert plain.stop() == 0

    # A restart with a models directory (no --allow-pull: offline): the cached model is
    # listed unloaded, and a request loads it and is answered.
    (tmp_path / "models").mkdir()
    second = start_server("--models-dir", str(tmp_path / "models"), "--model", "echo", env=env)
    try:
        assert _statuses(second.url) == {
            "echo": {"value": "loaded"},
            NAME: {"value": "unloaded"},
        }
        r = _chat(second.url, NAME)
        assert r.status_code == 200, r.text
        assert r.json()["choices"][0]["message"]["content"]
        assert _statuses(second.url)[NAME] == {"value": "loaded"}
        assert hub.log == fetched  # nothing fetched since the pull
        # `zeroserve rm`, then a rescan: unloaded and gone; a request for it is a 404.
        rm = subprocess.run(
            [sys.executable, "-m", "zeroserve", "rm", NAME],
            env=server_env(env),
            capture_output=True,
            text=True,
            timeout=scaled(60),
            check=False,
        )
        assert rm.returncode == 0, rm.stderr
        assert not any((tmp_path / "cache").rglob("*.gguf"))
        r = httpx.post(second.url + "/v2/repository/index", json={}, timeout=scaled(WAIT_S))
        assert r.status_code == 200, r.text
        assert list(_statuses(second.url)) == ["echo"]
        r = _chat(second.url, NAME)
        assert r.status_code == 404, r.text
        assert r.json()["error"]["param"] == "model"  # error bodies never echo input
    finally:
        assert second.stop() == 0


@pytest.mark.niced
def test_a_named_pull_keeps_its_name_after_a_restart(hub: LoopbackHub, tmp_path: Path) -> None:
    env = {"HF_ENDPOINT": hub.url, "ZEROSERVE_CACHE": str(tmp_path / "cache")}
    first = start_server("--model", "echo", "--allow-pull", env=env)
    try:
        pull = {"model": SOURCE, "name": "chat"}
        r = httpx.post(first.url + "/models/pull", json=pull, timeout=scaled(WAIT_S))
        assert r.status_code == 200, r.text
        assert r.json() == {"success": True, "model": "chat"}
        # A rescan lists the file under its name only, not also under the file's.
        r = httpx.post(first.url + "/v2/repository/index", json={}, timeout=scaled(WAIT_S))
        assert r.status_code == 200, r.text
        assert sorted(_statuses(first.url)) == ["chat", "echo"]
    finally:
        assert first.stop() == 0

    # Restarted (offline, serving the cache): the model is `chat`, not its file's name,
    # in the catalog, to a request and in `zeroserve list`.
    (tmp_path / "models").mkdir()
    second = start_server("--models-dir", str(tmp_path / "models"), "--model", "echo", env=env)
    try:
        assert _statuses(second.url) == {"echo": {"value": "loaded"}, "chat": {"value": "unloaded"}}
        r = _chat(second.url, "chat")
        assert r.status_code == 200, r.text
        assert r.json()["choices"][0]["message"]["content"]
        assert _chat(second.url, NAME).status_code == 404
        listed = _cli(env, "list")
        assert [line.split("\t")[0] for line in listed.stdout.splitlines()] == ["chat"]
        # `zeroserve rm chat`, then a rescan: gone, file and name.
        assert _cli(env, "rm", "chat").returncode == 0
        assert not any((tmp_path / "cache").rglob("*.gguf"))
        r = httpx.post(second.url + "/v2/repository/index", json={}, timeout=scaled(WAIT_S))
        assert r.status_code == 200, r.text
        assert list(_statuses(second.url)) == ["echo"]
    finally:
        assert second.stop() == 0


def test_a_corrupt_name_index_does_not_stop_the_server(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    (cache / "url" / "host.example").mkdir(parents=True)
    (cache / "url" / "host.example" / "tiny.gguf").write_bytes(b"GGUF")
    (cache / "names.json").write_bytes(b'{"version": 1, "names": {"tiny": ')
    env = {"ZEROSERVE_CACHE": str(cache)}
    (tmp_path / "models").mkdir()
    server = start_server("--models-dir", str(tmp_path / "models"), "--model", "echo", env=env)
    try:  # served under its file's name, the index ignored
        assert _statuses(server.url) == {"echo": {"value": "loaded"}, "tiny": {"value": "unloaded"}}
    finally:
        assert server.stop() == 0
    listed = _cli(env, "models", "--models-dir", str(tmp_path / "models"))
    assert listed.returncode == 0 and "tiny" in listed.stdout
    assert "corrupt name index" in listed.stderr  # and said so


def _cli(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "zeroserve", *args],
        env=server_env(env),
        capture_output=True,
        text=True,
        timeout=scaled(60),
        check=False,
    )
