"""``POST /v1/responses`` on llama.cpp's engine: real SmolLM2 through the official
``openai`` SDK's ``client.responses`` (whole, streamed, and the SDK's stream helper,
which rebuilds the answer from the events and so checks their order), raw bytes for the
SSE format, and the 400s of a stateless server. Answers are a few tokens, greedy.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from typing import Any

import httpx
import jsonschema
import openai
import pytest
from openai.types.responses import ResponseStreamEvent
from pydantic import TypeAdapter

from tests.models.test_llamacpp import _metric, _wait_idle
from tests.support import ServerProcess, model_scaled, scaled, start_server
from tests.support.smollm2 import require_llamacpp, smollm2_arg

# Waits on smollm2's decode, below the loop: bounds by model_slowdown (tests/conftest.py).
pytestmark = pytest.mark.niced

require_llamacpp()

FRANCE = "What is the capital of France?"
STORY = "Write a very long story about a dragon, with many details."
CITY_SCHEMA = {
    "type": "object",
    "properties": {"city": {"type": "string"}},
    "required": ["city"],
    "additionalProperties": False,
}
# The events of one streamed text answer, in OpenAI's order (deltas in the middle).
HEAD = [
    "response.created",
    "response.in_progress",
    "response.output_item.added",
    "response.content_part.added",
]
TAIL = [
    "response.output_text.done",
    "response.content_part.done",
    "response.output_item.done",
]
# ``brief``'s request deadline: one second on a quiet machine, scaled, so that on a busy one
# its answer still begins (the stream's head) before the deadline ends it.
BRIEF_S = scaled(1.0)


@pytest.fixture(scope="module")
def llm() -> Iterator[ServerProcess]:
    server = start_server(
        "--model",
        smollm2_arg(n_ctx=2048),
        "--model",
        f"brief=smollm2?parallel=1&n_ctx=1024&timeout={BRIEF_S:g}",
        "--model",
        "echo",
    )
    yield server
    assert server.stop() == 0


@pytest.fixture
def client(llm: ServerProcess) -> Iterator[openai.OpenAI]:
    with llm.client() as c:
        yield c


def _chat_text(client: openai.OpenAI, messages: list[Any], max_tokens: int) -> str:
    r = client.chat.completions.create(
        model="smollm2", messages=messages, max_tokens=max_tokens, temperature=0
    )
    return r.choices[0].message.content or ""


def test_whole_answer(client: openai.OpenAI) -> None:
    r = client.responses.create(model="smollm2", input=FRANCE, max_output_tokens=12, temperature=0)
    assert r.object == "response" and r.id.startswith("resp_")
    assert r.model == "smollm2" and r.status == "completed"
    assert "Paris" in r.output_text
    # The translation is the chat completion with the same conversation.
    assert r.output_text == _chat_text(client, [{"role": "user", "content": FRANCE}], 12)
    assert r.usage is not None
    assert r.usage.input_tokens > 0 and r.usage.output_tokens > 0
    assert r.usage.total_tokens == r.usage.input_tokens + r.usage.output_tokens
    (item,) = r.output
    assert item.type == "message" and item.role == "assistant" and item.status == "completed"
    assert r.store is False and r.previous_response_id is None
    # Every field the SDK's types require is there (its own parse does not check).
    openai.types.responses.Response.model_validate(r.model_dump(warnings=False))


def test_instructions_and_message_items(client: openai.OpenAI) -> None:
    instructions = "You answer in one short sentence."
    question = "How do I open a file in Python?"
    r = client.responses.create(
        model="smollm2",
        instructions=instructions,
        input=[{"role": "user", "content": [{"type": "input_text", "text": question}]}],
        max_output_tokens=24,
        temperature=0,
    )
    assert r.instructions == instructions
    expected = _chat_text(
        client,
        [{"role": "system", "content": instructions}, {"role": "user", "content": question}],
        24,
    )
    assert r.output_text == expected
    assert "open(" in r.output_text


def test_stream_events_in_openai_order(client: openai.OpenAI) -> None:
    whole = client.responses.create(
        model="smollm2", input=FRANCE, max_output_tokens=12, temperature=0
    )
    events = list(
        client.responses.create(
            model="smollm2", input=FRANCE, max_output_tokens=12, temperature=0, stream=True
        )
    )
    types = [e.type for e in events]
    deltas = [e for e in events if e.type == "response.output_text.delta"]
    assert deltas
    assert types == [*HEAD, *["response.output_text.delta"] * len(deltas), *TAIL, types[-1]]
    assert [e.sequence_number for e in events] == list(range(len(events)))
    text = "".join(e.delta for e in deltas)
    assert text == whole.output_text
    done = events[len(HEAD) + len(deltas)]
    assert done.type == "response.output_text.done" and done.text == text
    created, final = events[0], events[-1]
    assert created.type == "response.created" and created.response.status == "in_progress"
    assert final.type == "response.completed"
    assert final.response.status == "completed" and final.response.output_text == text
    assert final.response.id == created.response.id
    assert {e.item_id for e in deltas} == {final.response.output[0].id}
    assert final.response.usage is not None and final.response.usage.output_tokens > 0
    adapter: Any = TypeAdapter(ResponseStreamEvent)
    for e in events:  # each event as strictly as the SDK's types describe it
        adapter.validate_python(e.model_dump(warnings=False))


def test_sdk_stream_helper_rebuilds_the_answer(client: openai.OpenAI) -> None:
    whole = client.responses.create(
        model="smollm2", input=FRANCE, max_output_tokens=12, temperature=0
    )
    with client.responses.stream(
        model="smollm2", input=FRANCE, max_output_tokens=12, temperature=0
    ) as stream:
        texts = [e.delta for e in stream if e.type == "response.output_text.delta"]
        final = stream.get_final_response()
    assert "".join(texts) == final.output_text == whole.output_text


def test_async_stream(llm: ServerProcess) -> None:
    async def go() -> tuple[str, str]:
        async with openai.AsyncOpenAI(
            base_url=llm.url + "/v1", api_key="unused", max_retries=0
        ) as c:
            stream = await c.responses.create(
                model="smollm2", input=FRANCE, max_output_tokens=12, temperature=0, stream=True
            )
            parts = []
            last = ""
            async for e in stream:
                if e.type == "response.output_text.delta":
                    parts.append(e.delta)
                last = e.type
            return "".join(parts), last

    text, last = asyncio.run(go())
    assert "Paris" in text and last == "response.completed"


def test_sse_wire_format(llm: ServerProcess) -> None:
    """Each event is ``event: <type>`` then ``data: <json>`` whose ``type`` is the same."""
    body = {"model": "smollm2", "input": FRANCE, "max_output_tokens": 4, "stream": True}
    with httpx.stream(
        "POST", llm.url + "/v1/responses", json=body, timeout=model_scaled(60)
    ) as resp:
        assert resp.status_code == 200
        assert resp.headers["content-type"].startswith("text/event-stream")
        raw = resp.read().decode()
    blocks = [b for b in raw.split("\n\n") if b]
    assert len(blocks) >= len(HEAD) + len(TAIL) + 1
    for block in blocks:
        event, data = block.split("\n")
        assert event.startswith("event: ") and data.startswith("data: ")
        assert json.loads(data[len("data: ") :])["type"] == event[len("event: ") :]


def test_max_output_tokens_makes_it_incomplete(client: openai.OpenAI) -> None:
    r = client.responses.create(
        model="smollm2", input="Write a long story about a dragon.", max_output_tokens=3
    )
    assert r.status == "incomplete"
    assert r.incomplete_details is not None
    assert r.incomplete_details.reason == "max_output_tokens"
    assert r.usage is not None and r.usage.output_tokens == 3
    events = list(
        client.responses.create(
            model="smollm2",
            input="Write a long story about a dragon.",
            max_output_tokens=3,
            stream=True,
        )
    )
    assert events[-1].type == "response.incomplete"
    assert events[-1].response.status == "incomplete"


def test_json_schema_format_validates(client: openai.OpenAI) -> None:
    r = client.responses.create(
        model="smollm2",
        input="Name a city in France as JSON.",
        max_output_tokens=40,
        temperature=0,
        text={
            "format": {"type": "json_schema", "name": "city", "schema": CITY_SCHEMA, "strict": True}
        },
    )
    jsonschema.validate(json.loads(r.output_text), CITY_SCHEMA)
    assert r.text is not None and r.text.format is not None
    assert r.text.format.type == "json_schema"


BAD: list[tuple[dict[str, Any], str]] = [
    ({"previous_response_id": "resp_123"}, "previous_response_id"),
    ({"store": True}, "store"),
    ({"conversation": "conv_1"}, "conversation"),
    ({"background": True}, "background"),
    ({"tools": [{"type": "web_search"}]}, "tools[0].type"),
    ({"reasoning": {"effort": "low"}}, "reasoning"),
    ({"include": ["message.output_text.logprobs"]}, "include"),
    ({"truncation": "auto"}, "truncation"),
    ({"not_a_parameter": 1}, "not_a_parameter"),
    (
        {"input": [{"role": "user", "content": [{"type": "input_image", "file_id": "f"}]}]},
        "input[0].content[0].file_id",
    ),
    (
        {"input": [{"role": "user", "content": [{"type": "input_audio"}]}]},
        "input[0].content[0]",
    ),
    ({"text": {"format": {"type": "json_schema", "name": "x"}}}, "text.format.schema"),
    (
        {"text": {"format": {"type": "json_schema", "name": "x", "schema": {"type": 7}}}},
        "text.format",
    ),
    ({"max_output_tokens": 100000}, "max_output_tokens"),
]


@pytest.mark.parametrize(("extra", "param"), BAD, ids=[p for _, p in BAD])
def test_bad_input_is_a_400_naming_it(
    llm: ServerProcess, extra: dict[str, Any], param: str
) -> None:
    body = {"model": "smollm2", "input": "Hi", "max_output_tokens": 2, **extra}
    resp = httpx.post(llm.url + "/v1/responses", json=body, timeout=model_scaled(60))
    assert resp.status_code == 400, resp.text
    error = resp.json()["error"]
    assert error["param"] == param
    _wait_idle(llm.url, "smollm2")


def test_sdk_sees_a_stateless_refusal(client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as info:
        client.responses.create(model="smollm2", input="Hi", previous_response_id="resp_1")
    assert info.value.param == "previous_response_id"


def test_every_chat_model_serves_it(llm: ServerProcess) -> None:
    """One chat path: the Responses API is a front end over every backend, so a model's
    own ``generate`` (echo) serves it as llama.cpp's engine does."""
    resp = httpx.post(
        llm.url + "/v1/responses",
        json={"model": "echo", "input": "Hi there", "max_output_tokens": 3},
    )
    assert resp.status_code == 200, resp.text
    out = resp.json()
    # echo streams its templated prompt back: "<|user|>\nHi there\n<|assistant|>\n"
    assert out["output"][0]["content"][0]["text"] == "<|user|> Hi there"
    assert out["status"] == "incomplete" and out["usage"]["output_tokens"] == 3
    resp = httpx.post(llm.url + "/v1/responses", json={"model": "nope", "input": "Hi"})
    assert resp.status_code == 404
    # ... and the server still answers.
    assert httpx.get(llm.url + "/health").status_code == 200


# parameter -> (a value that matters, whether smollm2's engine honours or harmlessly
# accepts it); the SDK's own parameter list must match, so a new one fails until it is
# classified here.
RESPONSES: dict[str, tuple[Any, bool]] = {
    "access_programs": ({}, False),
    "background": (True, False),
    "background_options": ({}, False),
    "context_management": ([{"type": "compaction"}], False),
    "conversation": ("conv_1", False),
    "image": ({}, False),
    "include": (["message.output_text.logprobs"], False),
    "instructions": ("Be brief.", True),
    "max_output_tokens": (1, True),
    "max_tool_calls": (1, True),
    "metadata": ({"k": "v"}, True),
    "moderation": ({}, False),
    "parallel_tool_calls": (False, True),
    "previous_response_id": ("resp_1", False),
    "prompt": ({"id": "pmpt_1"}, False),
    "prompt_cache_key": ("k", True),
    "prompt_cache_options": ({}, True),
    "prompt_cache_retention": ("24h", True),
    "reasoning": ({"effort": "low"}, False),
    "safety_identifier": ("s", True),
    "service_tier": ("auto", True),
    "store": (True, False),
    "stream_options": ({"include_obfuscation": False}, True),
    "temperature": (0.5, True),
    "text": ({"format": {"type": "json_object"}}, True),
    "tool_choice": ("required", False),
    "tools": ([{"type": "function", "name": "f", "parameters": {}}], True),
    "top_logprobs": (2, False),
    "top_p": (0.5, True),
    "truncation": ("auto", False),
    "user": ("u", True),
}


def test_every_sdk_responses_parameter_is_classified(llm: ServerProcess) -> None:
    from openai.types.responses import response_create_params as params

    sdk = set(params.ResponseCreateParamsBase.__annotations__) - {"model", "input"}
    assert sdk == set(RESPONSES)
    for name, (value, honoured) in RESPONSES.items():
        body = {"model": "smollm2", "input": "Hi", "max_output_tokens": 1, name: value}
        resp = httpx.post(llm.url + "/v1/responses", json=body, timeout=model_scaled(60))
        if honoured:
            assert resp.status_code == 200, (name, resp.text)
        else:
            assert resp.status_code == 400, (name, resp.text)
            assert resp.json()["error"]["param"] == name
    _wait_idle(llm.url, "smollm2")


def test_disconnect_stops_the_generation(llm: ServerProcess) -> None:
    """A streamed answer dropped after two deltas stops its slot (counted as aborted)
    long before ``max_output_tokens``; the next request is served."""
    before = _metric(llm.url, "zeroserve_engine_aborted", "smollm2")
    tokens = _metric(llm.url, "zeroserve_generation_tokens_total", "smollm2")
    body = {"model": "smollm2", "input": STORY, "max_output_tokens": 900, "stream": True}
    with (
        httpx.Client(timeout=model_scaled(60)) as c,
        c.stream("POST", llm.url + "/v1/responses", json=body) as resp,
    ):
        deltas = 0
        for line in resp.iter_lines():
            if line == "event: response.output_text.delta":
                deltas += 1
                if deltas == 2:
                    break
    _wait_idle(llm.url, "smollm2")
    assert _metric(llm.url, "zeroserve_engine_aborted", "smollm2") >= before + 1
    made = _metric(llm.url, "zeroserve_generation_tokens_total", "smollm2") - tokens
    assert 0 < made < 900
    again = httpx.post(
        llm.url + "/v1/responses",
        json={"model": "smollm2", "input": "Hi", "max_output_tokens": 2},
        timeout=model_scaled(60),
    )
    assert again.status_code == 200


def test_deadline_ends_the_stream_with_an_error_event(client: openai.OpenAI) -> None:
    """``brief`` allows one second a request: once the events began, the deadline is an
    ``error`` event that ends the stream (and the slot stops at its next token)."""
    events = list(
        client.responses.create(model="brief", input=STORY, max_output_tokens=900, stream=True)
    )
    assert events[0].type == "response.created"
    assert events[-1].type == "error"
    assert events[-1].code == "deadline_exceeded"
    assert [e.sequence_number for e in events] == list(range(len(events)))


def test_deadline_of_a_whole_answer_frees_the_slot(client: openai.OpenAI) -> None:
    """A whole answer past ``brief``'s one second is a 504, and its only slot stops at
    once: the next request is served (it would wait for 900 tokens otherwise)."""
    with pytest.raises(openai.APIStatusError) as info:
        client.responses.create(model="brief", input=STORY, max_output_tokens=900)
    assert info.value.status_code == 504
    r = client.responses.create(model="brief", input="Hi", max_output_tokens=2)
    assert r.status == "incomplete" and r.usage is not None and r.usage.output_tokens == 2
