"""GET /v1/models and /v1/models/{id} in OpenAI's list/object shapes."""

from __future__ import annotations

import httpx
import openai
import pytest

from tests.support import ServerThread
from tests.support import run_async as run


def test_list_models(client: openai.OpenAI) -> None:
    page = client.models.list()
    ids = [m.id for m in page.data]
    assert ids[:3] == ["echo", "tinyllm", "minilm"]
    for m in page.data:
        assert m.object == "model"
        assert isinstance(m.created, int)
        assert m.owned_by in ("zeroserve", "user")
    tiny = next(m for m in page.data if m.id == "tinyllm")
    assert "demo model" in (tiny.model_extra or {})["description"]
    assert tiny.owned_by == "zeroserve"


def test_retrieve_model(client: openai.OpenAI) -> None:
    m = client.models.retrieve("minilm")
    assert (m.id, m.object, m.owned_by) == ("minilm", "model", "zeroserve")


def test_retrieve_unknown_model_is_404(client: openai.OpenAI) -> None:
    with pytest.raises(openai.NotFoundError) as info:
        client.models.retrieve("no-such-model")
    body = info.value.body
    assert isinstance(body, dict)
    assert body["code"] == "model_not_found"
    assert "no-such-model" not in info.value.response.text


def test_list_models_async(server: ServerThread) -> None:
    async def main() -> list[str]:
        async with server.async_client() as c:
            return [m.id async for m in c.models.list()]

    assert "tinyllm" in run(main())


def test_exact_wire_shape(server: ServerThread) -> None:
    r = httpx.get(server.url + "/v1/models")
    assert r.status_code == 200
    assert r.headers["content-type"] == "application/json"
    doc = r.json()
    assert doc["object"] == "list"
    assert set(doc["data"][0]) == {
        "id",
        "object",
        "created",
        "owned_by",
        "description",
        "capabilities",
    }
    by_id = {m["id"]: m["capabilities"] for m in doc["data"]}
    # What each model serves, before a client sends: tinyllm's own generate honours
    # vLLM's sampling extensions and no other optional chat parameter (a 400 names one
    # given), echo also embeds.
    assert by_id["tinyllm"] == {
        "chat": True,
        "embeddings": False,
        "parameters": ["top_k", "min_p", "repetition_penalty", "ignore_eos", "min_tokens"],
        "relayed": False,
        "context_length": by_id["tinyllm"]["context_length"],
        "embedding_dimensions": None,
        "token_inputs": False,
        "tokenizer": True,
        "rerank": None,
        "input_modalities": ["text"],
    }
    assert by_id["echo"]["embedding_dimensions"] == 64
    # echo has no tokenizer; it reranks by the cosine of its embeddings.
    assert (by_id["echo"]["tokenizer"], by_id["echo"]["rerank"]) == (False, "bi-encoder")
    assert by_id["echo"]["embeddings"] is True
