"""What goes to the llama.cpp engine (``app/backends/llamacpp/requests.py`` and
``tools.py``), against the real SmolLM2 engine in-process, whose template has no tools:
the chat and Responses requests decoded by their front ends, the tool plans (the generic
format for ``auto``, a grammar-forced call for ``required``), the default system prompt,
and an agent loop's items as the messages the template knows (docs/models.md, "Tools
with tool_choice auto")."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import msgspec
import pytest

from tests.support.smollm2 import loaded_smollm2, require_llamacpp
from zeroserve.app.backends.llamacpp.requests import Requests, requests
from zeroserve.app.backends.llamacpp.tools import AutoTool, ForcedTool
from zeroserve.app.chat import ChatRequest
from zeroserve.app.limits import ApiLimits
from zeroserve.app.openai.chat import ChatCompletions
from zeroserve.app.openai.responses import Responses
from zeroserve.errors import RequestError
from zeroserve.models.llamacpp import SmolLM2Model

require_llamacpp()

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
        },
    }
]
THREE = [
    TOOLS[0],
    {"type": "function", "function": {"name": "get_time", "description": "The time."}},
    {"type": "function", "function": {"name": "set_units", "parameters": {"type": "object"}}},
]
WEATHER = {
    "type": "function",
    "name": "get_weather",
    "description": "The weather.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
}
SYSTEM = "You are a helpful assistant."


@pytest.fixture(scope="module")
def smollm2() -> Iterator[SmolLM2Model]:
    yield from loaded_smollm2(n_ctx=256, parallel=1, threads=1)


@pytest.fixture
def native(smollm2: SmolLM2Model) -> Iterator[SmolLM2Model]:
    smollm2.native_tools = True  # as the engine reports for a template with tool calls
    try:
        yield smollm2
    finally:
        smollm2.native_tools = False


def _chat(**extra: object) -> ChatRequest:
    raw = {"model": "smollm2", "messages": [{"role": "user", "content": "hi"}], **extra}
    return ChatCompletions(ApiLimits()).parse(memoryview(msgspec.json.encode(raw)))


def _responses(**fields: Any) -> ChatRequest:
    body = {"model": "smollm2", "input": "hi", **fields}
    return Responses(ApiLimits()).parse(memoryview(msgspec.json.encode(body)))


def _sent(r: Requests) -> Any:
    (body,) = r.bodies
    return msgspec.json.decode(body)


def _allowed(mode: str, *names: str) -> dict[str, object]:
    tools = [{"type": "function", "function": {"name": n}} for n in names]
    return {"type": "allowed_tools", "allowed_tools": {"mode": mode, "tools": tools}}


def test_smollm2_template_has_no_native_tools(smollm2: SmolLM2Model) -> None:
    assert smollm2.native_tools is False


def test_a_chat_gets_the_default_system_prompt_and_streams(smollm2: SmolLM2Model) -> None:
    # OpenAI allows nulls for what a message may omit: they are defaults, not fields.
    user = {"role": "user", "content": "hi", "name": None, "tool_call_id": None}
    sent = _sent(requests(_chat(messages=[user], max_tokens=4, temperature=0), smollm2))
    assert sent["messages"] == [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": "hi"},
    ]
    assert sent["stream"] is True and sent["stream_options"] == {"include_usage": True}
    assert (sent["max_tokens"], sent["temperature"], sent["model"]) == (4, 0, "smollm2")
    own = _sent(requests(_chat(messages=[{"role": "developer", "content": "Be brief."}]), smollm2))
    assert own["messages"] == [{"role": "system", "content": "Be brief."}]


def test_n_choices_are_one_request_each_with_their_seeds(smollm2: SmolLM2Model) -> None:
    r = requests(_chat(n=3, seed=7), smollm2)
    assert [msgspec.json.decode(b)["seed"] for b in r.bodies] == [7, 8, 9]


@pytest.mark.parametrize("choice", ["auto", None])
def test_auto_plans_the_generic_format(smollm2: SmolLM2Model, choice: str | None) -> None:
    extra: dict[str, object] = {"tools": TOOLS}
    if choice is not None:
        extra["tool_choice"] = choice
    r = requests(_chat(**extra), smollm2)
    assert isinstance(r.plan, AutoTool) and r.error_param == "tools"
    sent = _sent(r)
    assert "tools" not in sent and "tool_choice" not in sent
    assert sent["messages"][0]["role"] == "system"
    assert '{"tool_calls"' in sent["messages"][0]["content"]
    assert "get_weather" in sent["messages"][0]["content"]
    grammar = sent["grammar"]
    assert grammar.startswith("%llguidance")
    assert "start: tool_call | text_answer" in grammar and '"get_weather"' in grammar


def test_parallel_tool_calls_false_allows_one_call(smollm2: SmolLM2Model) -> None:
    def grammar(**extra: object) -> str:
        r = requests(_chat(tools=TOOLS, **extra), smollm2)
        assert isinstance(r.plan, AutoTool)
        return str(_sent(r)["grammar"]).replace(" ", "")

    assert '"maxItems":1' in grammar(parallel_tool_calls=False)
    assert "maxItems" not in grammar(parallel_tool_calls=True)


def test_none_goes_to_the_engine_unchanged(smollm2: SmolLM2Model) -> None:
    r = requests(_chat(tools=TOOLS, tool_choice="none"), smollm2)
    assert r.plan is None
    assert _sent(r)["tool_choice"] == "none" and _sent(r)["tools"] == TOOLS


def test_a_native_template_gets_the_tools_unchanged(native: SmolLM2Model) -> None:
    r = requests(_chat(tools=TOOLS, tool_choice="auto"), native)
    assert r.plan is None and _sent(r)["tools"] == TOOLS


def test_allowed_tools_required_forces_a_call_of_the_allowed_only(smollm2: SmolLM2Model) -> None:
    r = requests(
        _chat(tools=THREE, tool_choice=_allowed("required", "set_units", "get_time")), smollm2
    )
    assert isinstance(r.plan, ForcedTool)
    assert [t.name for t in r.plan.tools] == ["get_time", "set_units"]  # tools' order
    sent = _sent(r)
    system = sent["messages"][0]["content"]
    assert "get_time" in system and "set_units" in system and "get_weather" not in system
    branches = sent["response_format"]["json_schema"]["schema"]["anyOf"]
    assert [b["properties"]["name"]["const"] for b in branches] == ["get_time", "set_units"]
    one = requests(_chat(tools=THREE, tool_choice=_allowed("required", "get_time")), smollm2)
    assert isinstance(one.plan, ForcedTool) and one.plan.single == "get_time"


def test_allowed_tools_auto_offers_the_allowed_only(smollm2: SmolLM2Model) -> None:
    r = requests(_chat(tools=THREE, tool_choice=_allowed("auto", "get_time")), smollm2)
    assert isinstance(r.plan, AutoTool)
    sent = _sent(r)
    assert '"get_time"' in sent["grammar"] and "get_weather" not in sent["grammar"]
    assert "get_weather" not in sent["messages"][0]["content"]


def test_allowed_tools_auto_on_a_native_template_sends_the_allowed_only(
    native: SmolLM2Model,
) -> None:
    r = requests(_chat(tools=THREE, tool_choice=_allowed("auto", "set_units")), native)
    assert r.plan is None
    sent = _sent(r)
    assert sent["tools"] == [THREE[2]] and sent["tool_choice"] == "auto"
    forced = requests(_chat(tools=THREE, tool_choice=_allowed("required", "set_units")), native)
    assert isinstance(forced.plan, ForcedTool)


def test_allowed_tools_naming_another_function_is_refused() -> None:
    for mode in ("auto", "required"):
        with pytest.raises(RequestError) as info:
            _chat(tools=THREE[:2], tool_choice=_allowed(mode, "set_units"))
        assert info.value.param == "tool_choice"


# -- the Responses API's requests ----------------------------------------------------------
def test_a_named_function_is_a_forced_plan(smollm2: SmolLM2Model) -> None:
    r = requests(
        _responses(tools=[WEATHER], tool_choice={"type": "function", "name": "get_weather"}),
        smollm2,
    )
    assert isinstance(r.plan, ForcedTool) and r.plan.single == "get_weather"
    sent = _sent(r)
    assert "tools" not in sent  # described in the system message, constrained by grammar
    assert sent["response_format"]["json_schema"]["schema"] == WEATHER["parameters"]
    assert "get_weather" in sent["messages"][0]["content"]
    assert r.error_param == "tools"


def test_auto_is_the_generic_format_bounded_by_max_tool_calls(smollm2: SmolLM2Model) -> None:
    unbounded = requests(_responses(tools=[WEATHER]), smollm2)
    assert isinstance(unbounded.plan, AutoTool)
    assert "maxItems" not in _sent(unbounded)["grammar"]
    for fields in ({"max_tool_calls": 2}, {"parallel_tool_calls": False}):
        r = requests(_responses(tools=[WEATHER], tool_choice="auto", **fields), smollm2)
        assert isinstance(r.plan, AutoTool)
        want = 2 if "max_tool_calls" in fields else 1
        assert f'"maxItems":{want}' in _sent(r)["grammar"].replace(" ", ""), fields


def test_none_sends_the_tools_in_chat_shape(smollm2: SmolLM2Model) -> None:
    r = requests(_responses(tools=[WEATHER], tool_choice="none"), smollm2)
    assert r.plan is None
    sent = _sent(r)
    assert sent["tool_choice"] == "none"
    assert sent["tools"] == [
        {"type": "function", "function": {k: v for k, v in WEATHER.items() if k != "type"}}
    ]
    assert sent["messages"][0] == {"role": "system", "content": SYSTEM}


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
    sent = _sent(requests(_responses(input=items), smollm2))["messages"]
    assert [m["role"] for m in sent] == ["system", "user", "assistant", "tool", "tool"]
    assistant = sent[2]
    assert assistant["content"] == "Looking."
    assert [c["id"] for c in assistant["tool_calls"]] == ["c1", "c2"]
    assert assistant["tool_calls"][0]["function"] == {"name": "get_weather", "arguments": "{}"}
    assert sent[3] == {"role": "tool", "content": "sunny", "tool_call_id": "c1"}
    assert sent[4]["content"] == "rain" and sent[4]["tool_call_id"] == "c2"


def test_a_native_template_gets_the_tools_and_no_max_tool_calls(native: SmolLM2Model) -> None:
    r = requests(_responses(tools=[WEATHER], parallel_tool_calls=False), native)
    assert r.plan is None
    sent = _sent(r)
    assert sent["tools"][0]["function"]["name"] == "get_weather"
    assert sent["tool_choice"] == "auto" and sent["parallel_tool_calls"] is False
    with pytest.raises(RequestError) as info:
        requests(_responses(tools=[WEATHER], max_tool_calls=1), native)
    assert info.value.param == "max_tool_calls"


def test_allowed_tools_on_a_native_template_send_the_allowed_only(native: SmolLM2Model) -> None:
    time_tool = {"type": "function", "name": "get_time", "parameters": {"type": "object"}}
    allowed = {
        "type": "allowed_tools",
        "mode": "auto",
        "tools": [{"type": "function", "name": "get_time"}],
    }
    chat = _responses(tools=[WEATHER, time_tool], tool_choice=allowed)
    assert [t.name for t in chat.tools or ()] == ["get_weather", "get_time"]
    r = requests(chat, native)
    assert r.plan is None
    sent = _sent(r)
    assert [x["function"]["name"] for x in sent["tools"]] == ["get_time"]
    assert sent["tool_choice"] == "auto"
