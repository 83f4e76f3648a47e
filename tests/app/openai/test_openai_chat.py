"""POST /v1/chat/completions through the official SDK, sync and async."""

from __future__ import annotations

import openai
import pytest

from tests.support import ServerThread
from tests.support import run_async as run

MESSAGES = [{"role": "user", "content": "str.split"}]


def collect(stream: openai.Stream) -> tuple[str, list[object]]:
    chunks = list(stream)
    text = "".join(
        c.choices[0].delta.content or "" for c in chunks if c.choices and c.choices[0].delta
    )
    return text, chunks


def test_non_streaming(client: openai.OpenAI) -> None:
    r = client.chat.completions.create(
        model="tinyllm", messages=MESSAGES, max_tokens=12, temperature=0
    )
    assert r.object == "chat.completion"
    assert r.id.startswith("chatcmpl-")
    assert r.model == "tinyllm"
    (choice,) = r.choices
    assert choice.index == 0
    assert choice.message.role == "assistant"
    assert choice.finish_reason == "length"
    assert r.usage is not None
    assert r.usage.completion_tokens == 12
    assert r.usage.total_tokens == r.usage.prompt_tokens + 12


def test_prompt_tokens_count_the_templated_prompt(client: openai.OpenAI) -> None:
    from zeroserve.models.tinyllm import TinyLlamaModel

    model = TinyLlamaModel()
    model.load()
    messages = [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "str.split"},
    ]
    templated = model.chat_template(messages)
    r = client.chat.completions.create(
        model="tinyllm", messages=messages, max_tokens=1, temperature=0
    )
    assert r.usage is not None
    assert r.usage.prompt_tokens == model.count_tokens(templated)
    assert r.usage.prompt_tokens > model.count_tokens("be brief str.split")


def test_streaming_matches_non_streaming(client: openai.OpenAI) -> None:
    kw = dict(model="tinyllm", messages=MESSAGES, max_tokens=30, temperature=0)
    whole = client.chat.completions.create(**kw)  # type: ignore[call-overload]
    text, chunks = collect(client.chat.completions.create(stream=True, **kw))  # type: ignore[call-overload]
    assert text == whole.choices[0].message.content
    ids = {c.id for c in chunks}  # type: ignore[attr-defined]
    assert len(ids) == 1 and next(iter(ids)).startswith("chatcmpl-")
    first = chunks[0]
    assert first.choices[0].delta.role == "assistant"  # type: ignore[attr-defined]
    assert all(c.choices[0].delta.role is None for c in chunks[1:])  # type: ignore[attr-defined]
    finished = [c for c in chunks if c.choices[0].finish_reason]  # type: ignore[attr-defined]
    assert len(finished) == 1 and finished[0] is chunks[-1]
    assert finished[0].choices[0].finish_reason == whole.choices[0].finish_reason  # type: ignore[attr-defined]
    assert all(c.object == "chat.completion.chunk" for c in chunks)  # type: ignore[attr-defined]
    assert all(c.usage is None for c in chunks)  # type: ignore[attr-defined]


def test_include_usage_chunk_comes_last(client: openai.OpenAI) -> None:
    stream = client.chat.completions.create(
        model="tinyllm",
        messages=MESSAGES,
        max_tokens=8,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    last = chunks[-1]
    assert last.choices == []
    assert last.usage is not None and last.usage.completion_tokens == 8
    assert all(c.usage is None for c in chunks[:-1])
    assert chunks[-2].choices[0].finish_reason == "length"
    whole = client.chat.completions.create(
        model="tinyllm", messages=MESSAGES, max_tokens=8, temperature=0
    )
    assert whole.usage == last.usage


def test_echo_model_stop_and_length(client: openai.OpenAI) -> None:
    # echo's default chat template wraps the message; its words come back, cycling.
    r = client.chat.completions.create(
        model="echo", messages=[{"role": "user", "content": "a b c"}], max_tokens=3
    )
    assert r.choices[0].finish_reason == "length"
    r = client.chat.completions.create(
        model="echo", messages=[{"role": "user", "content": "a b c"}], max_completion_tokens=100
    )
    assert r.choices[0].finish_reason == "length"
    r = client.chat.completions.create(
        model="echo", messages=[{"role": "user", "content": "a b c"}]
    )
    assert r.choices[0].finish_reason == "stop"
    assert "a b c" in (r.choices[0].message.content or "")


def test_stop_sequences(client: openai.OpenAI) -> None:
    # echo ignores ``stop``; the API layer still applies it (across piece boundaries).
    r = client.completions.create(
        model="echo", prompt="alpha beta gamma delta", max_tokens=8, stop=" gamma"
    )
    assert (r.choices[0].text, r.choices[0].finish_reason) == ("alpha beta", "stop")
    r = client.completions.create(
        model="echo", prompt="alpha beta gamma delta", max_tokens=8, stop=["zzz", "mma d"]
    )
    assert (r.choices[0].text, r.choices[0].finish_reason) == ("alpha beta ga", "stop")
    r = client.completions.create(
        model="echo", prompt="alpha beta gamma delta", max_tokens=8, stop="zzz"
    )
    assert r.choices[0].finish_reason == "length"


def test_stop_sequences_on_the_model(client: openai.OpenAI) -> None:
    kw = dict(model="tinyllm", messages=MESSAGES, max_tokens=40, temperature=1.0, seed=5)
    text = client.chat.completions.create(**kw).choices[0].message.content or ""  # type: ignore[call-overload]
    cut = text[10:13]
    assert len(cut) == 3
    whole = client.chat.completions.create(stop=cut, **kw)  # type: ignore[call-overload]
    assert whole.choices[0].finish_reason == "stop"
    assert whole.choices[0].message.content == text[: text.index(cut)]
    streamed, _ = collect(client.chat.completions.create(stop=[cut], stream=True, **kw))  # type: ignore[call-overload]
    assert streamed == text[: text.index(cut)]


def test_content_parts_equal_plain_content(client: openai.OpenAI) -> None:
    plain = client.chat.completions.create(
        model="tinyllm",
        messages=[{"role": "user", "content": "str\nsplit"}],
        max_tokens=10,
        temperature=0,
    )
    parts = client.chat.completions.create(
        model="tinyllm",
        messages=[
            {
                "role": "user",
                "content": [{"type": "text", "text": "str"}, {"type": "text", "text": "split"}],
            }
        ],
        max_tokens=10,
        temperature=0,
    )
    assert parts.choices[0].message.content == plain.choices[0].message.content
    assert parts.usage == plain.usage


def test_seed_makes_sampling_repeatable(client: openai.OpenAI) -> None:
    kw = dict(model="tinyllm", messages=MESSAGES, max_tokens=20, temperature=1.0, top_p=0.9)
    a = client.chat.completions.create(seed=7, **kw)  # type: ignore[call-overload]
    b = client.chat.completions.create(seed=7, **kw)  # type: ignore[call-overload]
    assert a.choices[0].message.content == b.choices[0].message.content


def test_n_choices(client: openai.OpenAI) -> None:
    r = client.chat.completions.create(
        model="tinyllm", messages=MESSAGES, max_tokens=10, temperature=1.0, seed=3, n=3
    )
    assert [c.index for c in r.choices] == [0, 1, 2]
    one = client.chat.completions.create(
        model="tinyllm", messages=MESSAGES, max_tokens=10, temperature=1.0, seed=3
    )
    assert r.choices[0].message.content == one.choices[0].message.content
    assert r.usage is not None and one.usage is not None
    assert r.usage.prompt_tokens == one.usage.prompt_tokens
    assert r.usage.completion_tokens == 30
    stream = client.chat.completions.create(
        model="tinyllm",
        messages=MESSAGES,
        max_tokens=10,
        temperature=1.0,
        seed=3,
        n=3,
        stream=True,
    )
    texts = ["", "", ""]
    roles = [0, 0, 0]
    reasons: list[list[str]] = [[], [], []]
    for chunk in stream:
        for c in chunk.choices:
            texts[c.index] += c.delta.content or ""
            roles[c.index] += c.delta.role == "assistant"
            if c.finish_reason:
                reasons[c.index].append(c.finish_reason)
    assert texts == [c.message.content for c in r.choices]
    assert roles == [1, 1, 1]
    assert reasons == [["length"]] * 3


def test_async_sdk_stream_and_whole(server: ServerThread) -> None:
    async def main() -> tuple[str, str]:
        async with server.async_client() as c:
            whole = await c.chat.completions.create(
                model="tinyllm",
                messages=MESSAGES,
                max_tokens=16,
                temperature=0,  # type: ignore[arg-type]
            )
            stream = await c.chat.completions.create(
                model="tinyllm",
                messages=MESSAGES,
                max_tokens=16,
                temperature=0,
                stream=True,  # type: ignore[arg-type]
            )
            text = ""
            async for chunk in stream:
                if chunk.choices:
                    text += chunk.choices[0].delta.content or ""
            return whole.choices[0].message.content or "", text

    whole, streamed = run(main())
    assert whole == streamed


def test_every_executor_gives_the_same_answer(
    client: openai.OpenAI, request: pytest.FixtureRequest
) -> None:
    ref = client.chat.completions.create(
        model="tinyllm", messages=MESSAGES, max_tokens=20, temperature=0
    )
    inline = client.chat.completions.create(
        model="tinyllm-inline", messages=MESSAGES, max_tokens=20, temperature=0
    )
    assert inline.choices[0].message.content == ref.choices[0].message.content
    assert inline.usage == ref.usage
    process_server: ServerThread = request.getfixturevalue("process_server")
    with process_server.client() as pc:
        other = pc.chat.completions.create(
            model="tinyllm-process", messages=MESSAGES, max_tokens=20, temperature=0
        )
    assert other.choices[0].message.content == ref.choices[0].message.content
    assert other.choices[0].finish_reason == ref.choices[0].finish_reason
