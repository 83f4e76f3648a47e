"""POST /v1/completions (one prompt or a list) and POST /v1/embeddings (float, base64)."""

from __future__ import annotations

import base64

import numpy as np
import openai
import pytest

from tests.support import ServerThread
from tests.support import run_async as run
from zeroserve.models.minilm import MiniLMEmbedder


def test_completion_single_prompt(client: openai.OpenAI) -> None:
    r = client.completions.create(model="echo", prompt="one two three", max_tokens=5)
    assert r.object == "text_completion"
    assert r.id.startswith("cmpl-")
    (c,) = r.choices
    assert (c.index, c.text, c.finish_reason) == (0, "one two three one two", "length")
    assert r.usage is not None
    assert (r.usage.prompt_tokens, r.usage.completion_tokens) == (3, 5)


def test_completion_default_max_tokens_is_16(client: openai.OpenAI) -> None:
    r = client.completions.create(model="echo", prompt="w")
    assert r.choices[0].text.split() == ["w"] * 16


def test_completion_list_of_prompts(client: openai.OpenAI) -> None:
    prompts = ["a b", "c", "d e f"]
    r = client.completions.create(model="echo", prompt=prompts, max_tokens=3)
    assert [c.index for c in r.choices] == [0, 1, 2]
    assert [c.text for c in r.choices] == ["a b a", "c c c", "d e f"]
    assert r.usage is not None and r.usage.prompt_tokens == 6
    # n choices per prompt, indexed prompt-major as OpenAI does
    r = client.completions.create(model="echo", prompt=["a", "b"], max_tokens=1, n=2)
    assert [(c.index, c.text) for c in r.choices] == [(0, "a"), (1, "a"), (2, "b"), (3, "b")]


def test_completion_stream_list_of_prompts(client: openai.OpenAI) -> None:
    prompts = ["the list type", "for"]
    whole = client.completions.create(model="tinyllm", prompt=prompts, max_tokens=9, temperature=0)
    stream = client.completions.create(
        model="tinyllm",
        prompt=prompts,
        max_tokens=9,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    )
    texts = ["", ""]
    reasons: list[list[str]] = [[], []]
    chunks = list(stream)
    for chunk in chunks:
        assert chunk.object == "text_completion"
        for c in chunk.choices:
            texts[c.index] += c.text
            if c.finish_reason:
                reasons[c.index].append(c.finish_reason)
    assert texts == [c.text for c in whole.choices]
    assert reasons == [[c.finish_reason] for c in whole.choices]
    assert len({c.id for c in chunks}) == 1
    assert chunks[-1].choices == [] and chunks[-1].usage == whole.usage


def test_completion_async(server: ServerThread) -> None:
    async def main() -> tuple[str, str]:
        async with server.async_client() as c:
            whole = await c.completions.create(
                model="tinyllm", prompt="The for statement", max_tokens=12, temperature=0
            )
            text = ""
            async for chunk in await c.completions.create(
                model="tinyllm",
                prompt="The for statement",
                max_tokens=12,
                temperature=0,
                stream=True,
            ):
                text += chunk.choices[0].text if chunk.choices else ""
            return whole.choices[0].text, text

    whole, streamed = run(main())
    assert whole == streamed


@pytest.fixture(scope="module")
def minilm() -> MiniLMEmbedder:
    m = MiniLMEmbedder()
    m.load()
    return m


def test_embeddings_float_and_base64(client: openai.OpenAI, minilm: MiniLMEmbedder) -> None:
    texts = ["a cat sat on the mat", "zero-copy inference"]
    ref = minilm.embed(texts)
    floats = client.embeddings.create(model="minilm", input=texts, encoding_format="float")
    assert floats.object == "list" and floats.model == "minilm"
    assert [d.index for d in floats.data] == [0, 1]
    got = np.array([d.embedding for d in floats.data], dtype=np.float32)
    np.testing.assert_allclose(got, ref, atol=1e-6)
    # The SDK asks for base64 by default and decodes it to floats itself.
    default = client.embeddings.create(model="minilm", input=texts)
    np.testing.assert_array_equal(
        np.array([d.embedding for d in default.data], dtype=np.float32), got
    )
    assert floats.usage.prompt_tokens == default.usage.prompt_tokens > 0
    assert floats.usage.total_tokens == floats.usage.prompt_tokens


def test_embeddings_base64_wire_format(client: openai.OpenAI) -> None:
    raw = client.embeddings.with_raw_response.create(
        model="minilm", input="hello", encoding_format="base64"
    )
    doc = raw.http_response.json()
    vec = np.frombuffer(base64.b64decode(doc["data"][0]["embedding"]), dtype="<f4")
    assert vec.shape == (384,)
    assert abs(float(np.linalg.norm(vec)) - 1.0) < 1e-4


def test_embeddings_single_string_and_dimensions(client: openai.OpenAI) -> None:
    r = client.embeddings.create(model="minilm", input="hello", dimensions=384)
    assert len(r.data) == 1 and len(r.data[0].embedding) == 384
    with pytest.raises(openai.BadRequestError) as info:
        client.embeddings.create(model="minilm", input="hello", dimensions=64)
    assert info.value.body["param"] == "dimensions"  # type: ignore[index]


def test_embeddings_async(server: ServerThread) -> None:
    async def main() -> int:
        async with server.async_client() as c:
            r = await c.embeddings.create(model="echo", input=["x", "y", "z"])
            return len(r.data)

    assert run(main()) == 3
