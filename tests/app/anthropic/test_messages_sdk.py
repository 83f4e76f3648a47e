"""Anthropic's Messages API through the official ``anthropic`` SDK, on every backend:
``echo`` and ``tinyllm`` (a model's own ``generate``), ``smollm2`` (llama.cpp's engine)
and ``far`` / ``near`` (``remote:`` models relayed to another zeroserve): whole, streamed
with the SDK's own accumulator, async; stop sequences; forced tool calls and a tool
round trip; token counting."""

from __future__ import annotations

import asyncio
from typing import Any

import anthropic
import jsonschema
import pytest

from tests.app.anthropic.messages_suite import async_client, client
from tests.support import ServerProcess, ServerThread

# Its smollm2 cases wait on the niced decode: pytest-timeout by model_slowdown
# (tests/conftest.py; decision 0055).
pytestmark = pytest.mark.niced

HELLO: Any = [{"role": "user", "content": "Tell me about the sea"}]
GREEDY: Any = {"temperature": 0}
WEATHER: Any = {
    "name": "get_weather",
    "description": "The weather in a city",
    "input_schema": {
        "type": "object",
        "properties": {"city": {"type": "string"}},
        "required": ["city"],
    },
}


def _url(local: ServerThread, gateway: ServerProcess, model: str) -> str:
    return gateway.url if model in ("far", "near") else local.url


@pytest.mark.parametrize("model", ["echo", "tinyllm", "smollm2", "far", "near"])
def test_whole_and_streamed_answers_agree(
    local: ServerThread, gateway: ServerProcess, model: str
) -> None:
    c = client(_url(local, gateway, model))
    kw: Any = {"model": model, "max_tokens": 8, "messages": HELLO, "extra_body": GREEDY}
    whole = c.messages.create(**kw)
    assert whole.type == "message" and whole.role == "assistant"
    assert whole.id.startswith("msg_")
    assert whole.stop_reason == "max_tokens" and whole.stop_sequence is None
    assert whole.usage.output_tokens == 8 and whole.usage.input_tokens > 0
    assert [b.type for b in whole.content] == ["text"]
    text = whole.content[0].text  # type: ignore[union-attr]
    assert text
    # A relayed answer comes back as the upstream wrote it (docs/gateway.md).
    upstream = {"far": "tinyllm", "near": "smollm2"}
    assert whole.model == upstream.get(model, model)

    with c.messages.stream(**kw) as stream:
        streamed = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert streamed == text  # greedy: the same answer streamed
    assert final.content[0].text == text  # type: ignore[union-attr]
    assert final.stop_reason == "max_tokens" and final.usage.output_tokens == 8


def test_async_client(local: ServerThread) -> None:
    async def main() -> tuple[str, str]:
        async with async_client(local.url) as c:
            kw: Any = {"model": "tinyllm", "max_tokens": 6, "messages": HELLO, "extra_body": GREEDY}
            whole = await c.messages.create(**kw)
            async with c.messages.stream(**kw) as stream:
                streamed = "".join([t async for t in stream.text_stream])
            return whole.content[0].text, streamed  # type: ignore[union-attr]

    whole, streamed = asyncio.run(asyncio.wait_for(main(), 60))
    assert whole and whole == streamed


def test_system_as_a_string_and_as_blocks(local: ServerThread) -> None:
    """``echo`` repeats its templated prompt: the system text is in it either way."""
    c = client(local.url)
    for system in ("be brief", [{"type": "text", "text": "be brief"}]):
        m = c.messages.create(
            model="echo", max_tokens=64, system=system, messages=[{"role": "user", "content": "hi"}]
        )
        assert "be brief" in m.content[0].text  # type: ignore[union-attr]


@pytest.mark.parametrize("model", ["tinyllm", "smollm2"])
def test_a_stop_sequence_is_named_in_the_answer(local: ServerThread, model: str) -> None:
    c = client(local.url)
    kw: Any = {"model": model, "max_tokens": 60, "messages": HELLO, "extra_body": GREEDY}
    free = c.messages.create(**kw).content[0].text  # type: ignore[union-attr]
    words = free.split()
    assert len(words) > 3
    stop = " " + words[2]  # a word the greedy answer does write
    m = c.messages.create(stop_sequences=["never-written", stop], **kw)
    assert m.stop_reason == "stop_sequence"
    assert m.stop_sequence == stop
    text = m.content[0].text  # type: ignore[union-attr]
    assert stop not in text and free.startswith(text)
    with c.messages.stream(stop_sequences=[stop], **kw) as stream:
        final = stream.get_final_message()
    assert final.stop_reason == "stop_sequence" and final.stop_sequence == stop
    assert final.content[0].text == text  # type: ignore[union-attr]


def test_top_k_is_honoured_by_the_engine_and_tinyllm_and_refused_by_name_elsewhere(
    local: ServerThread,
) -> None:
    c = client(local.url)
    kw: Any = {"max_tokens": 4, "messages": HELLO}
    m = c.messages.create(model="smollm2", extra_body={"top_k": 1}, **kw)
    assert m.usage.output_tokens == 4
    # top_k 1 is greedy at any temperature: tinyllm's sampler answers as at temperature 0.
    # (this SDK's create has no temperature argument: it goes in the body as sent)
    greedy = c.messages.create(model="tinyllm", extra_body={"temperature": 0}, **kw)
    m = c.messages.create(model="tinyllm", extra_body={"temperature": 1, "top_k": 1}, **kw)
    assert m.content == greedy.content
    with pytest.raises(anthropic.BadRequestError) as info:
        c.messages.create(model="echo", extra_body={"top_k": 1}, **kw)
    body: Any = info.value.body
    assert body["type"] == "error" and body["error"]["type"] == "invalid_request_error"
    assert "'top_k'" in body["error"]["message"]


@pytest.mark.parametrize(
    "choice", [{"type": "any"}, {"type": "tool", "name": "get_weather"}], ids=["any", "tool"]
)
def test_a_forced_tool_call_matches_its_schema(local: ServerThread, choice: Any) -> None:
    c = client(local.url)
    lookup = {**WEATHER, "name": "lookup", "description": "Look a word up"}
    kw: Any = {
        "model": "smollm2",
        "max_tokens": 64,
        "messages": [{"role": "user", "content": "What is the weather in Paris?"}],
        "tools": [WEATHER, lookup],
        "tool_choice": {**choice, "disable_parallel_tool_use": True},
        "extra_body": GREEDY,
    }
    whole = c.messages.create(**kw)
    assert whole.stop_reason == "tool_use"
    calls = [b for b in whole.content if b.type == "tool_use"]
    assert len(calls) == 1
    call = calls[0]
    assert call.name in ("get_weather", "lookup")
    if choice["type"] == "tool":
        assert call.name == "get_weather"
    jsonschema.validate(call.input, WEATHER["input_schema"])

    with c.messages.stream(**kw) as stream:
        final = stream.get_final_message()
    streamed = [b for b in final.content if b.type == "tool_use"]
    assert final.stop_reason == "tool_use" and len(streamed) == 1
    assert streamed[0].name == call.name and streamed[0].input == call.input


def test_a_tool_round_trip(local: ServerThread) -> None:
    """The call, its ``tool_result`` sent back, and an answer in words."""
    c = client(local.url)
    messages: Any = [{"role": "user", "content": "What is the weather in Paris?"}]
    first = c.messages.create(
        model="smollm2",
        max_tokens=64,
        messages=messages,
        tools=[WEATHER],
        tool_choice={"type": "any"},
        extra_body=GREEDY,
    )
    (call,) = [b for b in first.content if b.type == "tool_use"]
    messages += [
        {"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in first.content]},
        {
            "role": "user",
            "content": [
                {"type": "tool_result", "tool_use_id": call.id, "content": "Sunny, 24 C"},
                {"type": "text", "text": "So, what is it like?"},
            ],
        },
    ]
    answer = c.messages.create(
        model="smollm2", max_tokens=32, messages=messages, tools=[WEATHER], extra_body=GREEDY
    )
    assert answer.stop_reason in ("end_turn", "max_tokens", "tool_use")
    assert answer.content


@pytest.mark.parametrize("model", ["tinyllm", "smollm2", "far", "near"])
def test_count_tokens(local: ServerThread, gateway: ServerProcess, model: str) -> None:
    c = client(_url(local, gateway, model))
    short = c.messages.count_tokens(model=model, messages=[{"role": "user", "content": "hi"}])
    long = c.messages.count_tokens(
        model=model, system="be brief", messages=[{"role": "user", "content": "hi " * 50}]
    )
    assert 0 < short.input_tokens < long.input_tokens
    # The count is the prompt an answer reads: the same as the answer's own usage.
    m = c.messages.create(
        model=model, max_tokens=1, messages=[{"role": "user", "content": "hi"}], extra_body=GREEDY
    )
    read = m.usage.input_tokens + (m.usage.cache_read_input_tokens or 0)
    assert read == short.input_tokens


def test_a_prefill_is_continued_or_refused_by_name(local: ServerThread) -> None:
    """A last assistant message is continued by llama.cpp's engine; a model's own chat
    template cannot continue it, so that backend's 400 names ``messages``."""
    c = client(local.url)
    prefill: Any = [
        {"role": "user", "content": "What's the Greek name for Sun? (A) Sol (B) Helios"},
        {"role": "assistant", "content": "The best answer is ("},
    ]
    kw: Any = {"max_tokens": 6, "messages": prefill, "extra_body": GREEDY}
    m = c.messages.create(model="smollm2", **kw)
    text = m.content[0].text  # type: ignore[union-attr]
    assert text and not text.startswith("The best answer")  # the continuation only
    with pytest.raises(anthropic.BadRequestError) as info:
        c.messages.create(model="tinyllm", **kw)
    assert "messages" in info.value.body["error"]["message"]  # type: ignore[index]


@pytest.mark.parametrize(
    "choice",
    [
        None,
        {"type": "auto"},
        {"type": "any"},
        {"type": "tool", "name": "get_weather"},
        {"type": "none"},
    ],
)
def test_count_tokens_with_tools_is_the_prompt_the_engine_reads(
    local: ServerThread, choice: dict[str, Any] | None
) -> None:
    """smollm2's template knows no tools: the tools reach its prompt as a system turn (a
    forced call's, or the generic format's), and ``none`` leaves them out. The count
    renders the request the engine runs, so it equals the answer's own usage."""
    c = client(local.url)
    kw: Any = {"model": "smollm2", "messages": HELLO, "tools": [WEATHER]}
    if choice is not None:
        kw["tool_choice"] = choice
    bare = c.messages.count_tokens(model="smollm2", messages=HELLO).input_tokens
    counted = c.messages.count_tokens(**kw).input_tokens
    assert counted > bare if choice != {"type": "none"} else counted == bare
    m = c.messages.create(max_tokens=1, extra_body=GREEDY, **kw)
    assert m.usage.input_tokens + (m.usage.cache_read_input_tokens or 0) == counted
