"""Every route that names a model in its body loads a catalog model on demand, as chat
does (docs/architecture.md, "Models at run time"): ``/tokenize``, ``/detokenize`` and
``/v1/rerank`` against a real ``zeroserve serve --models-dir`` whose models start
``unloaded``; a name outside the catalog stays a 404."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.support import ServerProcess, model_scaled, start_server

pytest.importorskip("xllamacpp")

from zeroserve.models.llamacpp import smollm2_path

pytestmark = pytest.mark.niced
LOAD_WAIT_S = 60.0  # a SmolLM2 load and one short call, on a loaded machine


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    d: Path = tmp_path_factory.mktemp("models")
    (d / "small.gguf").symlink_to(smollm2_path())
    rr = d / "rr"
    rr.mkdir()
    (rr / "model.toml").write_text(
        f'spec = "llamacpp:{smollm2_path()}"\n[options]\n'
        'embedding = true\npooling = "rank"\nparallel = 1\nn_ctx = 1024\n'
    )
    s = start_server("--models-dir", str(d))
    yield s
    assert s.stop() == 0


def _state(server: ServerProcess, name: str) -> str:
    models = httpx.get(server.url + "/models", timeout=model_scaled(10)).json()["data"]
    return str(next(m for m in models if m["id"] == name)["status"]["value"])


def _unload(server: ServerProcess, name: str) -> None:
    r = httpx.post(server.url + "/models/unload", json={"model": name}, timeout=model_scaled(30))
    assert r.status_code == 200, r.text
    assert _state(server, name) == "unloaded"


def _post(server: ServerProcess, path: str, body: dict[str, Any]) -> httpx.Response:
    return httpx.post(server.url + path, json=body, timeout=model_scaled(LOAD_WAIT_S))


def test_tokenize_and_detokenize_load_an_unloaded_model(server: ServerProcess) -> None:
    _unload(server, "small")
    r = _post(server, "/tokenize", {"model": "small", "prompt": "Hello there"})
    assert r.status_code == 200, r.text
    tokens = r.json()["tokens"]
    assert tokens and _state(server, "small") == "loaded"
    _unload(server, "small")
    r = _post(server, "/detokenize", {"model": "small", "tokens": tokens})
    assert r.status_code == 200, r.text
    assert "Hello there" in r.json()["prompt"]
    assert _state(server, "small") == "loaded"


def test_rerank_loads_an_unloaded_reranker(server: ServerProcess) -> None:
    assert _state(server, "rr") == "unloaded"
    docs = ["a red apple", "the stock market", "green pears"]
    r = _post(server, "/v1/rerank", {"model": "rr", "query": "fruit", "documents": docs})
    assert r.status_code == 200, r.text
    results = r.json()["results"]
    assert sorted(x["index"] for x in results) == [0, 1, 2]
    assert _state(server, "rr") == "loaded"


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/tokenize", {"prompt": "hi"}),
        ("/detokenize", {"tokens": [1, 2]}),
        ("/v1/rerank", {"query": "q", "documents": ["d"]}),
    ],
)
def test_a_name_outside_the_catalog_is_a_404(
    server: ServerProcess, path: str, body: dict[str, Any]
) -> None:
    r = _post(server, path, {"model": "nope", **body})
    assert r.status_code == 404, r.text
    assert r.json()["error"]["param"] == "model"
