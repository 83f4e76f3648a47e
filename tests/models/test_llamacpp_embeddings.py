"""``/v1/embeddings`` from llama.cpp's engine: a ``llamacpp`` model started with
``embedding=true`` (here the built-in SmolLM2, mean-pooled), through the official
``openai`` SDK (which asks for base64) and raw JSON (floats). A request of many inputs
is embedded in bounded chunks: its answer is the same as one call's, and a deadline or a
client that leaves stops it within one chunk (docs/architecture.md, "The
llama.cpp backend")."""

from __future__ import annotations

import base64
from collections.abc import Iterator

import httpx
import numpy as np
import openai
import pytest

from tests.models.test_llamacpp import _metric, _wait_idle
from tests.support import ServerProcess, model_scaled, start_server
from tests.support.smollm2 import require_llamacpp
from zeroserve.app import limits as lim
from zeroserve.app.backends.llamacpp.embeddings import EMBED_CHUNK_INPUTS

# Waits on smollm2's decode, below the loop: bounds by model_slowdown (tests/conftest.py).
pytestmark = pytest.mark.niced

require_llamacpp()

CATS = ["The cat sat on the mat.", "A cat was sitting on a rug.", "Stock markets fell sharply."]


@pytest.fixture(scope="module")
def llm() -> Iterator[ServerProcess]:
    server = start_server(
        "--model",
        "vec=smollm2?parallel=1&n_ctx=1024&embedding=true",
        "--model",
        "plain=smollm2?parallel=1&n_ctx=1024",
    )
    yield server
    assert server.stop() == 0


@pytest.fixture
def client(llm: ServerProcess) -> Iterator[openai.OpenAI]:
    with llm.client() as c:
        yield c


def test_sdk_embeddings(client: openai.OpenAI) -> None:
    r = client.embeddings.create(model="vec", input=CATS)
    assert r.model == "vec"
    vecs = np.array([d.embedding for d in r.data])
    assert vecs.shape[0] == 3 and vecs.shape[1] > 0
    assert [d.index for d in r.data] == [0, 1, 2]
    np.testing.assert_allclose(np.linalg.norm(vecs, axis=1), 1.0, rtol=1e-3)
    sims = vecs @ vecs.T
    assert sims[0, 1] > sims[0, 2]  # the two cats are closer than a cat and the markets
    assert r.usage.prompt_tokens > 0
    again = client.embeddings.create(model="vec", input=CATS[0])
    np.testing.assert_allclose(again.data[0].embedding, vecs[0], atol=1e-5)


def test_float_and_base64_agree(llm: ServerProcess) -> None:
    url = llm.url + "/v1/embeddings"
    floats = httpx.post(
        url, json={"model": "vec", "input": CATS[0]}, timeout=model_scaled(60)
    ).json()
    packed = httpx.post(
        url,
        json={"model": "vec", "input": CATS[0], "encoding_format": "base64"},
        timeout=model_scaled(60),
    ).json()
    vec = np.array(floats["data"][0]["embedding"], dtype=np.float32)
    raw = np.frombuffer(base64.b64decode(packed["data"][0]["embedding"]), dtype="<f4")
    np.testing.assert_allclose(raw, vec, atol=1e-6)
    native = len(vec)
    same = httpx.post(
        url, json={"model": "vec", "input": "x", "dimensions": native}, timeout=model_scaled(60)
    )
    assert same.status_code == 200


@pytest.mark.parametrize(
    ("body", "param", "code"),
    [
        ({"model": "vec", "input": "x", "dimensions": 8}, "dimensions", None),
        ({"model": "vec", "input": []}, "input", None),
        ({"model": "vec", "input": "x", "truncate": True}, "truncate", None),
        ({"model": "plain", "input": "x"}, "model", "unsupported_capability"),
    ],
    ids=["dimensions", "empty", "unknown", "no-embedding-option"],
)
def test_bad_input_is_a_400(
    llm: ServerProcess, body: dict[str, object], param: str, code: str | None
) -> None:
    resp = httpx.post(llm.url + "/v1/embeddings", json=body, timeout=model_scaled(60))
    assert resp.status_code == 400, resp.text
    error = resp.json()["error"]
    assert error["param"] == param
    if code is not None:
        assert error["code"] == code
    _wait_idle(llm.url, "vec")


def test_an_embedding_model_still_chats(client: openai.OpenAI) -> None:
    r = client.chat.completions.create(
        model="vec",
        messages=[{"role": "user", "content": "What is the capital of France?"}],
        max_tokens=12,
        temperature=0,
    )
    assert "Paris" in (r.choices[0].message.content or "")


def test_many_inputs_are_embedded_in_chunks_with_one_answer(client: openai.OpenAI) -> None:
    """More inputs than a chunk: the answer is one list, in order, indexed from 0, the
    vectors those of each input alone, the usage the sum."""
    inputs = [f"{CATS[i % 3]} ({i})" for i in range(EMBED_CHUNK_INPUTS + 3)]
    r = client.embeddings.create(model="vec", input=inputs)
    assert [d.index for d in r.data] == list(range(len(inputs)))
    alone = [client.embeddings.create(model="vec", input=inputs[i]) for i in (0, -1)]
    np.testing.assert_allclose(r.data[0].embedding, alone[0].data[0].embedding, atol=1e-5)
    np.testing.assert_allclose(r.data[-1].embedding, alone[1].data[0].embedding, atol=1e-5)
    singles = sum(
        client.embeddings.create(model="vec", input=x).usage.prompt_tokens for x in inputs
    )
    assert r.usage.prompt_tokens == r.usage.total_tokens == singles


# As many inputs as a request may have: far more than can be embedded before the short
# deadline below, on any machine.
MANY = [f"Sentence number {i} is about cats and mats." for i in range(lim.MAX_EMBEDDING_INPUTS)]


def _embedded(llm: ServerProcess) -> float:
    return _metric(llm.url, "zeroserve_engine_embedded_inputs_total", "vec")


def _still_serves(llm: ServerProcess) -> None:
    ok = httpx.post(
        llm.url + "/v1/embeddings", json={"model": "vec", "input": "x"}, timeout=model_scaled(60)
    )
    assert ok.status_code == 200 and len(ok.json()["data"]) == 1


def test_a_deadline_stops_a_many_input_request_within_a_chunk(llm: ServerProcess) -> None:
    _wait_idle(llm.url, "vec")
    before = _embedded(llm)
    resp = httpx.post(
        llm.url + "/v1/embeddings",
        json={"model": "vec", "input": MANY},
        headers={"X-Stainless-Timeout": "1"},
        timeout=model_scaled(60),
    )
    assert resp.status_code == 504, resp.text
    _wait_idle(llm.url, "vec")  # the chunk that ran at the deadline has returned
    done = _embedded(llm) - before
    assert 0 <= done < len(MANY) and done % EMBED_CHUNK_INPUTS == 0
    _still_serves(llm)


def test_a_client_that_leaves_stops_a_many_input_request(llm: ServerProcess) -> None:
    _wait_idle(llm.url, "vec")
    before = _embedded(llm)
    with pytest.raises(httpx.ReadTimeout):  # the client gives up and closes its socket
        httpx.post(llm.url + "/v1/embeddings", json={"model": "vec", "input": MANY}, timeout=1)
    _wait_idle(llm.url, "vec")
    done = _embedded(llm) - before
    assert 0 <= done < len(MANY) and done % EMBED_CHUNK_INPUTS == 0
    _still_serves(llm)
