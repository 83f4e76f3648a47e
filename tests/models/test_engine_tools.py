"""The generic tool format's plan against the real SmolLM2 engine (in-process): what the
engine reports of its template, and what goes to it (docs/models.md, "Tools with
tool_choice auto")."""

from __future__ import annotations

from collections.abc import Iterator

import msgspec
import pytest

from zeroserve.app.engine_tools import AutoTool, ForcedTool, NativeTools, plan_tools
from zeroserve.app.openai import schemas as s
from zeroserve.errors import RequestError
from zeroserve.models.llamacpp import SmolLM2Model

pytest.importorskip("xllamacpp")

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
        },
    }
]


@pytest.fixture(scope="module")
def smollm2() -> Iterator[SmolLM2Model]:
    model = SmolLM2Model(n_ctx=256, parallel=1, threads=1)
    model.load()
    yield model


def _body(**extra: object) -> s.EngineChatRequest:
    raw = {"model": "smollm2", "messages": [{"role": "user", "content": "hi"}], **extra}
    return s.decode(s.engine_chat_decoder, memoryview(msgspec.json.encode(raw)))


def test_smollm2_template_has_no_native_tools(smollm2: SmolLM2Model) -> None:
    assert smollm2.native_tools is False


@pytest.mark.parametrize("choice", ["auto", None])
def test_auto_plans_the_generic_format(smollm2: SmolLM2Model, choice: str | None) -> None:
    extra: dict[str, object] = {"tools": TOOLS}
    if choice is not None:
        extra["tool_choice"] = choice
    plan = plan_tools(_body(**extra), smollm2)
    assert isinstance(plan, AutoTool)
    sent = msgspec.json.decode(plan.body)
    assert "tools" not in sent and "tool_choice" not in sent
    assert sent["messages"][0]["role"] == "system"
    assert '{"tool_calls"' in sent["messages"][0]["content"]
    assert "get_weather" in sent["messages"][0]["content"]
    grammar = sent["grammar"]
    assert grammar.startswith("%llguidance")
    assert "start: tool_call | text_answer" in grammar and '"get_weather"' in grammar


def test_parallel_tool_calls_false_allows_one_call(smollm2: SmolLM2Model) -> None:
    def grammar(**extra: object) -> str:
        plan = plan_tools(_body(tools=TOOLS, **extra), smollm2)
        assert isinstance(plan, AutoTool)
        return str(msgspec.json.decode(plan.body)["grammar"]).replace(" ", "")

    assert '"maxItems":1' in grammar(parallel_tool_calls=False)
    assert "maxItems" not in grammar(parallel_tool_calls=True)


def test_none_goes_to_the_engine_unchanged(smollm2: SmolLM2Model) -> None:
    assert plan_tools(_body(tools=TOOLS, tool_choice="none"), smollm2) is None


def test_a_native_template_gets_the_tools_unchanged(smollm2: SmolLM2Model) -> None:
    smollm2.native_tools = True  # as the engine reports for a template with tool calls
    try:
        assert plan_tools(_body(tools=TOOLS, tool_choice="auto"), smollm2) is None
    finally:
        smollm2.native_tools = False


THREE = [
    TOOLS[0],
    {"type": "function", "function": {"name": "get_time", "description": "The time."}},
    {"type": "function", "function": {"name": "set_units", "parameters": {"type": "object"}}},
]


def _allowed(mode: str, *names: str) -> dict[str, object]:
    tools = [{"type": "function", "function": {"name": n}} for n in names]
    return {"type": "allowed_tools", "allowed_tools": {"mode": mode, "tools": tools}}


def test_allowed_tools_required_forces_a_call_of_the_allowed_only(smollm2: SmolLM2Model) -> None:
    plan = plan_tools(
        _body(tools=THREE, tool_choice=_allowed("required", "set_units", "get_time")), smollm2
    )
    assert isinstance(plan, ForcedTool)
    assert [t.function.name for t in plan.tools] == ["get_time", "set_units"]  # tools' order
    sent = msgspec.json.decode(plan.body)
    system = sent["messages"][0]["content"]
    assert "get_time" in system and "set_units" in system and "get_weather" not in system
    branches = sent["response_format"]["json_schema"]["schema"]["anyOf"]
    assert [b["properties"]["name"]["const"] for b in branches] == ["get_time", "set_units"]
    one = plan_tools(_body(tools=THREE, tool_choice=_allowed("required", "get_time")), smollm2)
    assert isinstance(one, ForcedTool) and one.single == "get_time"


def test_allowed_tools_auto_offers_the_allowed_only(smollm2: SmolLM2Model) -> None:
    plan = plan_tools(_body(tools=THREE, tool_choice=_allowed("auto", "get_time")), smollm2)
    assert isinstance(plan, AutoTool)
    sent = msgspec.json.decode(plan.body)
    assert '"get_time"' in sent["grammar"] and "get_weather" not in sent["grammar"]
    assert "get_weather" not in sent["messages"][0]["content"]


def test_allowed_tools_auto_on_a_native_template_sends_the_allowed_only(
    smollm2: SmolLM2Model,
) -> None:
    smollm2.native_tools = True  # as the engine reports for a template with tool calls
    try:
        plan = plan_tools(_body(tools=THREE, tool_choice=_allowed("auto", "set_units")), smollm2)
        assert isinstance(plan, NativeTools)
        assert [t.function.name for t in plan.tools] == ["set_units"]
        assert msgspec.json.decode(plan.tools_json()) == [THREE[2]]
        forced = _allowed("required", "set_units")
        assert isinstance(plan_tools(_body(tools=THREE, tool_choice=forced), smollm2), ForcedTool)
    finally:
        smollm2.native_tools = False


def test_allowed_tools_naming_another_function_is_refused(smollm2: SmolLM2Model) -> None:
    for mode in ("auto", "required"):
        with pytest.raises(RequestError) as info:
            plan_tools(_body(tools=THREE[:2], tool_choice=_allowed(mode, "set_units")), smollm2)
        assert info.value.param == "tool_choice"
