"""Pulling through the API and ``source =`` in a ``model.toml`` (docs/models.md, "Pulling
models"): a real ``zeroserve serve`` process, the loopback hub (``HF_ENDPOINT``) and
httpx. Nothing is fetched without ``--allow-pull``; with it an admin's ``POST
/models/pull`` adds the model to the catalog, unloaded, and a ``model.toml`` source is
fetched at the model's first load, never at the scan."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.support import ServerProcess, scaled, start_server
from tests.support.hub import REPO, LoopbackHub, loopback_hub
from zeroserve.models.llamacpp import SMOLLM2_FILE, SMOLLM2_SHA256

pytest.importorskip("xllamacpp")
pytest.importorskip("huggingface_hub")

SOURCE = f"hf:{REPO}:{SMOLLM2_FILE}"
ADMIN = {"authorization": "Bearer sk-ops"}
APP = {"authorization": "Bearer sk-app"}
# The longest a pull (a loopback copy) and a load of SmolLM2 may take on a loaded machine.
WAIT_S = 120.0


@pytest.fixture
def hub() -> Iterator[LoopbackHub]:
    with loopback_hub() as server:
        yield server


def _serve(hub: LoopbackHub, root: Path, *extra: str) -> ServerProcess:
    keys = root / "keys.toml"
    keys.write_text('[keys.ops]\nkey = "sk-ops"\nadmin = true\n\n[keys.app]\nkey = "sk-app"\n')
    models = root / "models"
    (models / "later").mkdir(parents=True)
    (models / "later" / "model.toml").write_text(
        f'source = "{SOURCE}"\nsha256 = "{SMOLLM2_SHA256}"\n[options]\nn_ctx = 512\n'
    )
    env = {"HF_ENDPOINT": hub.url, "ZEROSERVE_CACHE": str(root / "cache")}
    args = ("--models-dir", str(models), "--model", "echo", "--api-keys-file", str(keys))
    return start_server(*args, *extra, env=env)


def _pull(server: ServerProcess, body: dict[str, Any], headers: dict[str, str]) -> httpx.Response:
    return httpx.post(
        server.url + "/models/pull", json=body, headers=headers, timeout=scaled(WAIT_S)
    )


def _status(server: ServerProcess, name: str) -> dict[str, Any]:
    listing = httpx.get(server.url + "/models", headers=APP).json()["data"]
    status: dict[str, Any] = {m["id"]: m["status"] for m in listing}[name]
    return status


def test_without_allow_pull_nothing_is_fetched(hub: LoopbackHub, tmp_path: Path) -> None:
    server = _serve(hub, tmp_path)
    try:
        r = _pull(server, {"model": SOURCE}, ADMIN)
        assert r.status_code == 403, r.text
        assert r.json()["error"]["code"] == "pull_disabled"
        assert "--allow-pull" in r.json()["error"]["message"]
        later = _status(server, "later")
        assert later["failed"] and "--allow-pull" in later["reason"]
        r = httpx.post(
            server.url + "/models/load", json={"model": "later"}, headers=ADMIN, timeout=30
        )
        assert r.status_code == 500 and "--allow-pull" in r.json()["error"]["message"]
    finally:
        assert server.stop() == 0
    assert hub.log == [] and not (tmp_path / "cache").exists()


def test_pull_route_and_model_toml_source(hub: LoopbackHub, tmp_path: Path) -> None:
    server = _serve(hub, tmp_path, "--allow-pull")
    cache = tmp_path / "cache"
    try:
        # The scan fetched nothing: the source waits for the model's first load.
        assert hub.log == [] and _status(server, "later") == {"value": "unloaded"}
        # A key without admin is refused before anything is fetched.
        r = _pull(server, {"model": SOURCE}, APP)
        assert r.status_code == 403 and r.json()["error"]["code"] == "permission_denied"
        assert hub.log == []
        # A bad source: 400 naming it; a file the hub lacks: 404.
        r = _pull(server, {"model": "/etc/passwd"}, ADMIN)
        assert r.status_code == 400 and "/etc/passwd" in r.json()["error"]["message"]
        r = _pull(server, {"model": f"hf:{REPO}:missing.gguf"}, ADMIN)
        assert r.status_code == 404, r.text
        assert r.json()["error"]["code"] == "pull_source_not_found"
        # A wrong pin: 400 naming both hashes, and the file is gone.
        wrong = "1" * 64
        r = _pull(server, {"model": f"{SOURCE}?sha256={wrong}"}, ADMIN)
        assert r.status_code == 400, r.text
        assert wrong in r.text and SMOLLM2_SHA256 in r.text
        assert not any(cache.rglob("*.gguf"))
        # A dropped connection: a clear error, only the resumable partial file left.
        hub.drop_after = 100_000
        r = _pull(server, {"model": SOURCE, "name": "small"}, ADMIN)
        assert r.status_code == 502 and "pull again" in r.json()["error"]["message"], r.text
        assert not any(cache.rglob("*.gguf"))
        hub.drop_after = None
        # The pull that works: the model enters the catalog, unloaded, then loads.
        r = _pull(server, {"model": f"{SOURCE}?sha256={SMOLLM2_SHA256}", "name": "small"}, ADMIN)
        assert r.status_code == 200, r.text
        assert r.json() == {"success": True, "model": "small"}
        assert _status(server, "small") == {"value": "unloaded"}
        assert not any(p.name.endswith(".incomplete") for p in cache.rglob("*"))
        load = httpx.post(
            server.url + "/models/load",
            json={"model": "later"},
            headers=ADMIN,
            timeout=scaled(WAIT_S),
        )
        assert load.status_code == 200, load.text
        assert _status(server, "later")["value"] == "loaded"
        chat = httpx.post(
            server.url + "/v1/chat/completions",
            json={
                "model": "later",
                "messages": [{"role": "user", "content": "Hi"}],
                "max_tokens": 4,
            },
            headers=APP,
            timeout=scaled(WAIT_S),
        )
        assert chat.status_code == 200, chat.text
        # A name the catalog already has is refused.
        r = _pull(server, {"model": SOURCE, "name": "later"}, ADMIN)
        assert r.status_code == 409 and r.json()["error"]["code"] == "model_exists"
    finally:
        assert server.stop() == 0
