"""``POST /v1/rerank`` (and ``/rerank``, ``/v2/rerank``; docs/extensions.md) in the
shape Jina, Cohere, vLLM and llama.cpp's server use, against a real server:

* ``minilm``, the offline default: the cosine of its embeddings (a bi-encoder, as its
  card says), checked against the cosine of the vectors ``/v1/embeddings`` returns;
* ``rr``: the built-in SmolLM2 GGUF started as llama.cpp's reranker
  (``embedding=true&pooling=rank``), through the engine's rerank call in chunks of 8
  documents. No reranker GGUF ships in a package, so this exercises the engine's path
  end to end, but SmolLM2 is no reranker: its scores are not relevance, and only their
  shape and order are checked;
* ``gw``: a ``remote:`` model relaying to the first server's ``minilm``.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import numpy as np
import pytest

from tests.support import ServerProcess, model_scaled, start_server
from zeroserve.models.llamacpp import smollm2_path

pytest.importorskip("xllamacpp")

# Its smollm2 cases wait on the niced decode: pytest-timeout by model_slowdown
# (tests/conftest.py; docs/decisions/0055-model-waits-scaled-for-the-niced-share.md).
pytestmark = pytest.mark.niced

QUERY = "What is the capital of France?"
DOCS = [
    "Bananas are yellow and grow in bunches.",
    "Paris is the capital and largest city of France.",
    {"text": "The Eiffel Tower is in Paris."},
    "Python is a programming language.",
]


@pytest.fixture(scope="module")
def srv() -> Iterator[ServerProcess]:
    rr = f"rr=llamacpp:{smollm2_path()}?embedding=true&pooling=rank&parallel=1&n_ctx=1024"
    server = start_server(
        "--model", "minilm", "--model", "echo", "--model", "tinyllm",
        "--model", "smollm2?parallel=1&n_ctx=1024", "--model", rr,
    )  # fmt: skip
    yield server
    assert server.stop() == 0


@pytest.fixture(scope="module")
def gateway(srv: ServerProcess) -> Iterator[ServerProcess]:
    server = start_server("--model", f"gw=remote:{srv.url}/v1?upstream_model=minilm")
    yield server
    assert server.stop() == 0


def _rerank(url: str, path: str = "/v1/rerank", **body: Any) -> httpx.Response:
    return httpx.post(url + path, json=body, timeout=model_scaled(120))


def _texts(docs: list[Any]) -> list[str]:
    return [d if isinstance(d, str) else d["text"] for d in docs]


def test_minilm_ranks_by_the_cosine_of_its_embeddings(srv: ServerProcess) -> None:
    r = _rerank(srv.url, model="minilm", query=QUERY, documents=DOCS)
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["model"] == "minilm" and body["id"].startswith("rerank-")
    results = body["results"]
    assert sorted(x["index"] for x in results) == [0, 1, 2, 3]
    scores = [x["relevance_score"] for x in results]
    assert scores == sorted(scores, reverse=True)
    assert results[0]["index"] == 1  # the capital of France
    assert [x["document"]["text"] for x in results] == [_texts(DOCS)[x["index"]] for x in results]
    # The same scores a client gets from the embeddings and a cosine of its own.
    emb = httpx.post(
        srv.url + "/v1/embeddings",
        json={"model": "minilm", "input": [QUERY, *_texts(DOCS)]},
        timeout=model_scaled(60),
    ).json()
    vecs = np.array([d["embedding"] for d in emb["data"]], dtype=np.float64)
    unit = vecs / np.linalg.norm(vecs, axis=1, keepdims=True)
    cosine = unit[1:] @ unit[0]
    for x in results:
        assert x["relevance_score"] == pytest.approx(cosine[x["index"]], abs=1e-5)
    assert body["usage"]["total_tokens"] == emb["usage"]["total_tokens"]


def test_top_n_and_return_documents(srv: ServerProcess) -> None:
    for path in ("/v1/rerank", "/rerank", "/v2/rerank"):
        r = _rerank(
            srv.url, path, model="minilm", query=QUERY, documents=DOCS, top_n=2,
            return_documents=False,
        )  # fmt: skip
        assert r.status_code == 200, r.text
        results = r.json()["results"]
        assert [x["index"] for x in results][:1] == [1]
        assert len(results) == 2 and all("document" not in x for x in results)


def test_llamacpp_reranker_scores_every_document_in_chunks(srv: ServerProcess) -> None:
    docs = [f"Document number {i} is about {'Paris' if i % 3 else 'bananas'}." for i in range(20)]
    r = _rerank(srv.url, model="rr", query=QUERY, documents=docs)
    assert r.status_code == 200, r.text
    body = r.json()
    results = body["results"]
    assert sorted(x["index"] for x in results) == list(range(20))  # 3 engine calls
    scores = [x["relevance_score"] for x in results]
    assert scores == sorted(scores, reverse=True)
    assert body["usage"]["prompt_tokens"] > 0


def test_a_relayed_model_reranks_upstream(srv: ServerProcess, gateway: ServerProcess) -> None:
    here = _rerank(srv.url, model="minilm", query=QUERY, documents=DOCS).json()
    there = _rerank(gateway.url, model="gw", query=QUERY, documents=DOCS)
    assert there.status_code == 200, there.text
    assert [x["index"] for x in there.json()["results"]] == [x["index"] for x in here["results"]]


@pytest.mark.parametrize(
    ("body", "status", "param"),
    [
        ({"model": "smollm2", "query": "q", "documents": ["a"]}, 400, "model"),
        ({"model": "tinyllm", "query": "q", "documents": ["a"]}, 400, "model"),
        ({"model": "nope", "query": "q", "documents": ["a"]}, 404, "model"),
        ({"model": "minilm", "query": "q", "documents": []}, 400, "documents"),
        ({"model": "minilm", "query": "q", "documents": ["a"] * 2049}, 400, "documents"),
        ({"model": "minilm", "query": "q", "documents": [{"txt": "a"}]}, 400, "documents[0].txt"),
        ({"model": "minilm", "query": "q", "documents": ["a"], "top_n": -1}, 400, "top_n"),
        ({"model": "minilm", "documents": ["a"]}, 400, "query"),
        ({"model": "minilm", "query": "q", "documents": ["a"], "max_tokens_per_doc": 5}, 400,
         "max_tokens_per_doc"),
    ],
)  # fmt: skip
def test_what_cannot_be_served_is_refused_naming_it(
    srv: ServerProcess, body: dict[str, Any], status: int, param: str
) -> None:
    r = _rerank(srv.url, **body)
    assert r.status_code == status, r.text
    assert r.json()["error"]["param"] == param


def test_the_card_says_how_each_model_reranks(srv: ServerProcess) -> None:
    cards = {c["id"]: c["capabilities"] for c in httpx.get(srv.url + "/v1/models").json()["data"]}
    assert {m: cards[m]["rerank"] for m in cards} == {
        "minilm": "bi-encoder",
        "echo": "bi-encoder",
        "tinyllm": None,
        "smollm2": None,
        "rr": "cross-encoder",
    }
