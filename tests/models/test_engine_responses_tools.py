"""The Responses API's tools as the chat request the engine gets
(``engine_responses.translate``, against the real SmolLM2 engine in-process, whose
template has no tools): the flat function tools become chat's, the tool choice picks the
chat tool plan, and an agent loop's items become the messages the template knows."""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Iterator
from typing import Any

import msgspec
import pytest
from openai.types.responses import (
    ResponseFunctionToolCall,
    ResponseOutputMessage,
    ResponseStreamEvent,
)
from pydantic import TypeAdapter

import openai
from zeroserve.app.engine_responses import ResponsesAnswer, decode_request, translate
from zeroserve.app.engine_tools import AutoTool, ForcedTool
from zeroserve.app.response import Response, StreamResponse
from zeroserve.errors import RequestError
from zeroserve.models.llamacpp import SmolLM2Model

pytest.importorskip("xllamacpp")

WEATHER = {
    "type": "function",
    "name": "get_weather",
    "description": "The weather.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
}


@pytest.fixture(scope="module")
def smollm2() -> Iterator[SmolLM2Model]:
    model = SmolLM2Model(n_ctx=256, parallel=1, threads=1)
    model.load()
    yield model


def _translate(engine: SmolLM2Model, **fields: Any) -> Any:
    body = {"model": "smollm2", "input": "hi", **fields}
    req = decode_request(memoryview(msgspec.json.encode(body)))
    return translate(req, "smollm2", "You are a helpful assistant.", engine)


def test_a_named_function_is_a_forced_plan(smollm2: SmolLM2Model) -> None:
    t = _translate(
        smollm2, tools=[WEATHER], tool_choice={"type": "function", "name": "get_weather"}
    )
    assert isinstance(t.plan, ForcedTool) and t.plan.single == "get_weather"
    sent = msgspec.json.decode(t.body)
    assert "tools" not in sent  # described in the system message, constrained by grammar
    schema = sent["response_format"]["json_schema"]["schema"]
    assert schema == WEATHER["parameters"]
    assert "get_weather" in sent["messages"][0]["content"]
    assert t.error_param == "tools"


def test_auto_is_the_generic_format_bounded_by_max_tool_calls(smollm2: SmolLM2Model) -> None:
    unbounded = _translate(smollm2, tools=[WEATHER])
    assert isinstance(unbounded.plan, AutoTool)
    assert "maxItems" not in msgspec.json.decode(unbounded.body)["grammar"]
    for fields in ({"max_tool_calls": 2}, {"parallel_tool_calls": False}):
        t = _translate(smollm2, tools=[WEATHER], tool_choice="auto", **fields)
        assert isinstance(t.plan, AutoTool)
        grammar = msgspec.json.decode(t.body)["grammar"]
        want = 2 if "max_tool_calls" in fields else 1
        assert f'"maxItems":{want}' in grammar.replace(" ", ""), fields


def test_none_sends_the_tools_in_chat_shape(smollm2: SmolLM2Model) -> None:
    t = _translate(smollm2, tools=[WEATHER], tool_choice="none")
    assert t.plan is None
    sent = msgspec.json.decode(t.body)
    assert sent["tool_choice"] == "none"
    assert sent["tools"] == [
        {
            "type": "function",
            "function": {k: v for k, v in WEATHER.items() if k != "type"},
        }
    ]
    assert sent["messages"][0] == {"role": "system", "content": "You are a helpful assistant."}


def test_agent_items_become_tool_calls_and_tool_messages(smollm2: SmolLM2Model) -> None:
    items = [
        {"role": "user", "content": "Weather in Paris and Rome?"},
        {"type": "message", "role": "assistant", "content": "Looking."},
        {"type": "function_call", "call_id": "c1", "name": "get_weather", "arguments": "{}"},
        {"type": "function_call", "call_id": "c2", "name": "get_weather", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "c1", "output": "sunny"},
        {
            "type": "function_call_output",
            "call_id": "c2",
            "output": [{"type": "input_text", "text": "rain"}],
        },
    ]
    t = _translate(smollm2, input=items)
    sent = msgspec.json.decode(t.body)["messages"]
    assert [m["role"] for m in sent] == ["system", "user", "assistant", "tool", "tool"]
    assistant = sent[2]
    assert assistant["content"] == "Looking."
    assert [c["id"] for c in assistant["tool_calls"]] == ["c1", "c2"]
    assert assistant["tool_calls"][0]["function"] == {"name": "get_weather", "arguments": "{}"}
    assert sent[3] == {"role": "tool", "content": "sunny", "tool_call_id": "c1"}
    assert sent[4]["content"] == "rain" and sent[4]["tool_call_id"] == "c2"


class _EngineChunks:
    """One engine call whose chunks are given: llama.cpp's streamed chat chunks as a
    model with a native tool template writes them (SmolLM2's template has none, so the
    real engine never makes them here). Everything after the engine is real."""

    complete = False
    model = "served"
    timings = None

    def __init__(self, chunks: list[dict[str, Any]]) -> None:
        self.chunks = deque(msgspec.json.encode(c) for c in chunks)
        self.closed = False

    def check(self, chunk: bytes) -> bytes:
        return chunk

    async def next_chunk(self) -> bytes | None:
        return self.chunks.popleft() if self.chunks else None

    def close(self) -> None:
        self.closed = True


def _chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
    return {
        "id": "chatcmpl-1",
        "object": "chat.completion.chunk",
        "created": 1,
        "model": "/models/x.gguf",
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
    }


def _call_delta(index: int, **fields: Any) -> dict[str, Any]:
    return {"tool_calls": [{"index": index, **fields}]}


NATIVE = [
    _chunk({"role": "assistant", "content": "Checking."}),
    _chunk(_call_delta(0, id="n1", type="function", function={"name": "get_weather"})),
    _chunk(_call_delta(0, function={"arguments": '{"city": '})),
    _chunk(_call_delta(0, function={"arguments": '"Paris"}'})),
    _chunk(_call_delta(1, id="n2", type="function", function={"name": "get_weather"})),
    _chunk(_call_delta(1, function={"arguments": '{"city": "Rome"}'})),
    _chunk({}, "tool_calls"),
    {**_chunk({}), "choices": [], "usage": {"prompt_tokens": 5, "completion_tokens": 9}},
]


@pytest.fixture
def native(smollm2: SmolLM2Model) -> Iterator[SmolLM2Model]:
    smollm2.native_tools = True  # as the engine reports for a template with tool calls
    try:
        yield smollm2
    finally:
        smollm2.native_tools = False


def test_a_native_template_gets_the_tools_and_no_max_tool_calls(native: SmolLM2Model) -> None:
    t = _translate(native, tools=[WEATHER], parallel_tool_calls=False)
    assert t.plan is None
    sent = msgspec.json.decode(t.body)
    assert sent["tools"][0]["function"]["name"] == "get_weather"
    assert sent["tool_choice"] == "auto" and sent["parallel_tool_calls"] is False
    with pytest.raises(RequestError) as info:
        _translate(native, tools=[WEATHER], max_tool_calls=1)
    assert info.value.param == "max_tool_calls"


def _answer(native: SmolLM2Model, stream: bool) -> tuple[ResponsesAnswer, Any]:
    body = {"model": "smollm2", "input": "hi", "tools": [WEATHER], "stream": stream}
    req = decode_request(memoryview(msgspec.json.encode(body)))
    return ResponsesAnswer(req, translate(req, "smollm2", None, native)), req


def test_native_calls_whole(native: SmolLM2Model) -> None:
    answer, _ = _answer(native, stream=False)
    call = _EngineChunks(NATIVE)
    first = call.chunks.popleft()
    resp = asyncio.run(answer.respond(call, first, chat=True, stream=False))
    assert isinstance(resp, Response) and call.closed
    out = openai.types.responses.Response.model_validate_json(b"".join(resp.body))
    message, one, two = out.output
    assert isinstance(message, ResponseOutputMessage) and out.output_text == "Checking."
    assert isinstance(one, ResponseFunctionToolCall) and isinstance(two, ResponseFunctionToolCall)
    assert (one.call_id, one.arguments) == ("n1", '{"city": "Paris"}')
    assert (two.call_id, two.arguments) == ("n2", '{"city": "Rome"}')
    assert out.model == "served" and out.usage is not None and out.usage.output_tokens == 9


def test_native_calls_streamed(native: SmolLM2Model) -> None:
    answer, _ = _answer(native, stream=True)
    call = _EngineChunks(NATIVE)
    first = call.chunks.popleft()

    async def events() -> list[bytes]:
        resp = await answer.respond(call, first, chat=True, stream=True)
        assert isinstance(resp, StreamResponse)
        out: list[bytes] = []
        try:
            while True:
                out.append(await resp.pieces.__anext__())
        except StopAsyncIteration:
            return out

    adapter: Any = TypeAdapter(ResponseStreamEvent)
    parsed = []
    for raw in asyncio.run(events()):
        head, data = raw.rstrip(b"\n").split(b"\n")
        event = adapter.validate_json(data.removeprefix(b"data: "))
        assert head == b"event: " + event.type.encode()
        parsed.append(event)
    kinds = [e.type for e in parsed]
    assert kinds == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",  # the message, opened by its text
        "response.content_part.added",
        "response.output_text.delta",
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.output_item.added",  # the first call
        "response.function_call_arguments.delta",
        "response.function_call_arguments.delta",
        "response.function_call_arguments.done",
        "response.output_item.done",
        "response.output_item.added",  # the second
        "response.function_call_arguments.delta",
        "response.function_call_arguments.done",
        "response.output_item.done",
        "response.completed",
    ]
    assert [e.sequence_number for e in parsed] == list(range(len(parsed)))
    done = [e for e in parsed if e.type == "response.output_item.done"]
    assert [e.output_index for e in done] == [0, 1, 2]
    final = parsed[-1].response
    assert final.output == [e.item for e in done]
    assert [o.arguments for o in final.output[1:]] == ['{"city": "Paris"}', '{"city": "Rome"}']


def test_allowed_tools_on_a_native_template_send_the_allowed_only(native: SmolLM2Model) -> None:
    time_tool = {"type": "function", "name": "get_time", "parameters": {"type": "object"}}
    allowed = {
        "type": "allowed_tools",
        "mode": "auto",
        "tools": [{"type": "function", "name": "get_time"}],
    }
    t = _translate(native, tools=[WEATHER, time_tool], tool_choice=allowed)
    assert t.plan is None and [x.name for x in t.tools] == ["get_weather", "get_time"]
    sent = msgspec.json.decode(t.body)
    assert [x["function"]["name"] for x in sent["tools"]] == ["get_time"]
    assert sent["tool_choice"] == "auto"
