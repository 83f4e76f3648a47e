"""The generic tool format's plan against the real SmolLM2 engine (in-process): what the
engine reports of its template, and what goes to it (docs/models.md, "Tools with
tool_choice auto")."""

from __future__ import annotations

from collections.abc import Iterator

import msgspec
import pytest

from zeroserve.app.engine_tools import AutoTool, plan_tools
from zeroserve.app.openai import schemas as s
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
