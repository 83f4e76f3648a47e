"""The Responses API's tools as the chat request the engine gets
(``engine_responses.translate``, against the real SmolLM2 engine in-process, whose
template has no tools): the flat function tools become chat's, the tool choice picks the
chat tool plan, and an agent loop's items become the messages the template knows."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import msgspec
import pytest

from zeroserve.app.engine_responses import decode_request, translate
from zeroserve.app.engine_tools import AutoTool, ForcedTool
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
