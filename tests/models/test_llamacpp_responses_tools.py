"""Function tools on ``POST /v1/responses`` (llama.cpp's engine, real SmolLM2, the
official ``openai`` SDK): a forced call is a ``function_call`` item whose ``arguments``
validate against the tool's schema, whole and streamed (the SDK parses every event and
the ``response.completed`` carries the same item); the agent loop's second turn (the
call and its ``function_call_output`` sent back) is answered with a message;
``tool_choice: "none"`` answers text; other tool types and tool choices are 400s naming
them. Answers are a few tokens, greedy.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import jsonschema
import openai
import pytest
from openai.lib.streaming.responses import (
    ResponseFunctionCallArgumentsDeltaEvent as ArgumentsSnapshot,
)
from openai.types.responses import (
    ResponseCompletedEvent,
    ResponseFunctionCallArgumentsDeltaEvent,
    ResponseFunctionCallArgumentsDoneEvent,
    ResponseFunctionToolCall,
    ResponseOutputItemAddedEvent,
    ResponseOutputItemDoneEvent,
    ResponseOutputMessage,
    ResponseStreamEvent,
)
from pydantic import TypeAdapter

from tests.models.test_llamacpp import _wait_idle
from tests.support import ServerProcess, model_scaled, start_server
from tests.support.smollm2 import require_llamacpp, smollm2_arg
from zeroserve.app import limits as lim

# Waits on smollm2's decode, below the loop: bounds by model_slowdown (tests/conftest.py).
pytestmark = pytest.mark.niced

require_llamacpp()

CITY_SCHEMA = {
    "type": "object",
    "properties": {"city": {"type": "string"}},
    "required": ["city"],
    "additionalProperties": False,
}
UNITS_SCHEMA = {
    "type": "object",
    "properties": {"unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
    "required": ["unit"],
}
WEATHER = {
    "type": "function",
    "name": "get_weather",
    "description": "The current weather in a city.",
    "parameters": CITY_SCHEMA,
    "strict": True,
}
UNITS = {
    "type": "function",
    "name": "set_units",
    "description": "Choose the temperature unit.",
    "parameters": UNITS_SCHEMA,
}
SCHEMAS = {"get_weather": CITY_SCHEMA, "set_units": UNITS_SCHEMA}
ASK = "What is the weather in Paris? Use the tool."
FORCED: Any = {"type": "function", "name": "get_weather"}


@pytest.fixture(scope="module")
def llm() -> Iterator[ServerProcess]:
    # One engine thread: with as many threads as cores (the default), each decode step
    # waits for whichever thread another process descheduled, and a loaded machine makes
    # a 40-token answer take tens of seconds (measured: 3x the time of threads=1 under
    # three CPU burners, the first event after 14 s); this file's answers are the
    # grammar-constrained ones, and one of them once ran past pytest's timeout.
    server = start_server("--model", smollm2_arg(n_ctx=2048, threads=1))
    yield server
    assert server.stop() == 0


@pytest.fixture
def client(llm: ServerProcess) -> Iterator[openai.OpenAI]:
    with llm.client() as c:
        yield c


def _valid_call(item: Any) -> ResponseFunctionToolCall:
    """``item`` is a completed function call whose arguments match its tool's schema."""
    assert isinstance(item, ResponseFunctionToolCall), item
    assert item.type == "function_call" and item.status == "completed"
    assert item.id and item.id.startswith("fc_") and item.call_id
    jsonschema.validate(json.loads(item.arguments), SCHEMAS[item.name])
    return item


def test_forced_tool_is_a_function_call(client: openai.OpenAI) -> None:
    r = client.responses.create(
        model="smollm2",
        input=ASK,
        tools=[WEATHER],  # type: ignore[list-item]
        tool_choice=FORCED,
        max_output_tokens=30,
        temperature=0,
    )
    assert r.status == "completed"
    # Every field the SDK's types require is there (its own parse does not check).
    openai.types.responses.Response.model_validate(r.model_dump(warnings=False))
    (item,) = r.output
    assert _valid_call(item).name == "get_weather"
    assert r.tool_choice.type == "function" and r.tool_choice.name == "get_weather"  # type: ignore[union-attr]
    (tool,) = r.tools
    assert tool.type == "function" and tool.name == "get_weather"
    assert tool.parameters == CITY_SCHEMA
    assert r.usage is not None and r.usage.output_tokens > 0


def test_required_picks_one_of_several_tools(client: openai.OpenAI) -> None:
    r = client.responses.create(
        model="smollm2",
        input=ASK,
        tools=[WEATHER, UNITS],  # type: ignore[list-item]
        tool_choice="required",
        max_output_tokens=40,
        temperature=0,
    )
    (item,) = r.output
    assert _valid_call(item).name in SCHEMAS
    assert r.tool_choice == "required"


def _stream(client: openai.OpenAI, input: Any = ASK, **kwargs: Any) -> list[Any]:
    with client.responses.create(
        model="smollm2", input=input, max_output_tokens=40, temperature=0, stream=True, **kwargs
    ) as stream:
        return list(stream)


@pytest.mark.parametrize(
    ("tools", "choice"),
    [([WEATHER], FORCED), ([WEATHER, UNITS], "required")],
    ids=["one-tool-arguments-as-made", "several-tools-whole-call"],
)
def test_forced_tool_streamed_events(client: openai.OpenAI, tools: Any, choice: Any) -> None:
    events = _stream(client, tools=tools, tool_choice=choice)
    kinds = [e.type for e in events]
    assert kinds[:3] == ["response.created", "response.in_progress", "response.output_item.added"]
    assert kinds[-3:] == [
        "response.function_call_arguments.done",
        "response.output_item.done",
        "response.completed",
    ]
    assert set(kinds[3:-3]) == {"response.function_call_arguments.delta"}
    assert [e.sequence_number for e in events] == list(range(len(events)))
    added, done, item_done, completed = events[2], events[-3], events[-2], events[-1]
    assert isinstance(added, ResponseOutputItemAddedEvent)
    assert isinstance(added.item, ResponseFunctionToolCall)
    assert added.item.status == "in_progress" and added.item.arguments == ""
    deltas = [e for e in events if isinstance(e, ResponseFunctionCallArgumentsDeltaEvent)]
    assert {d.item_id for d in deltas} == {added.item.id}
    assert isinstance(done, ResponseFunctionCallArgumentsDoneEvent)
    assert done.arguments == "".join(d.delta for d in deltas)
    assert isinstance(item_done, ResponseOutputItemDoneEvent)
    call = _valid_call(item_done.item)
    assert call.arguments == done.arguments and call.id == added.item.id
    assert call.name == added.item.name and call.call_id == added.item.call_id
    assert isinstance(completed, ResponseCompletedEvent)
    assert completed.response.output == [call]
    adapter: Any = TypeAdapter(ResponseStreamEvent)
    for e in events:  # each event as strictly as the SDK's types describe it
        adapter.validate_python(e.model_dump(warnings=False))


def test_sdk_stream_helper_rebuilds_the_call(client: openai.OpenAI) -> None:
    """The SDK's ``responses.stream`` helper accumulates the argument deltas into the
    item the ``output_item.added`` event opened; its final response is the call."""
    with client.responses.stream(
        model="smollm2",
        input=ASK,
        tools=[WEATHER],  # type: ignore[list-item]
        tool_choice=FORCED,
        max_output_tokens=30,
        temperature=0,
    ) as stream:
        built = [e.snapshot for e in stream if isinstance(e, ArgumentsSnapshot)]
        final = stream.get_final_response()
    (item,) = final.output
    call = _valid_call(item)
    assert built and built[-1] == call.arguments


def test_second_turn_is_answered_with_a_message(client: openai.OpenAI) -> None:
    """The agent loop: the forced call and the tool's output are sent back (with the
    tools again, ``auto``); the answer is a message (or, in the generic format, a call
    that validates), whole and streamed."""
    first = client.responses.create(
        model="smollm2",
        input=ASK,
        tools=[WEATHER],  # type: ignore[list-item]
        tool_choice=FORCED,
        max_output_tokens=30,
        temperature=0,
    )
    call = _valid_call(first.output[0])
    conversation: Any = [
        {"role": "user", "content": ASK},
        call.model_dump(exclude_none=True),
        {"type": "function_call_output", "call_id": call.call_id, "output": "sunny, 21 C"},
    ]
    for tools in ([], [WEATHER]):
        r = client.responses.create(
            model="smollm2",
            input=conversation,
            tools=tools,  # type: ignore[arg-type]
            max_output_tokens=12,
            temperature=0,
        )
        assert r.status in ("completed", "incomplete")
        (item,) = r.output
        if isinstance(item, ResponseFunctionToolCall):
            assert tools, "a call without tools"
            _valid_call(item)
        else:
            assert isinstance(item, ResponseOutputMessage)
            assert r.output_text.strip()
    events = _stream(client, tools=[], input=conversation)
    assert events[-1].type in ("response.completed", "response.incomplete")
    (item,) = events[-1].response.output
    assert isinstance(item, ResponseOutputMessage)
    assert item.content[0].text.strip()  # type: ignore[union-attr]


def test_tool_choice_none_answers_text(client: openai.OpenAI) -> None:
    r = client.responses.create(
        model="smollm2",
        input="What is the capital of France?",
        tools=[WEATHER],  # type: ignore[list-item]
        tool_choice="none",
        max_output_tokens=8,
        temperature=0,
    )
    (item,) = r.output
    assert isinstance(item, ResponseOutputMessage)
    assert r.output_text.strip()
    assert r.tool_choice == "none"


def test_auto_answers_a_valid_call_or_text(client: openai.OpenAI) -> None:
    """``auto`` on SmolLM2 (no native tool template): the generic format, whole and
    streamed; either way the output parses and a call validates."""
    for stream in (False, True):
        kwargs: Any = {"tools": [WEATHER], "tool_choice": "auto"}
        if stream:
            final = _stream(client, **kwargs)[-1].response
        else:
            final = client.responses.create(
                model="smollm2", input=ASK, max_output_tokens=40, temperature=0, **kwargs
            )
        assert final.output
        for item in final.output:
            if isinstance(item, ResponseFunctionToolCall):
                if final.status == "completed":
                    _valid_call(item)
            else:
                assert isinstance(item, ResponseOutputMessage)
                assert not item.content[0].text.lstrip().startswith("{") or (  # type: ignore[union-attr]
                    final.status == "incomplete"
                )


# An enum: greedy SmolLM2 may run a free zone string on to max_tokens.
ZONE_SCHEMA = {
    "type": "object",
    "properties": {"zone": {"type": "string", "enum": ["UTC", "Asia/Tokyo", "Europe/Paris"]}},
    "required": ["zone"],
    "additionalProperties": False,
}
TIME = {
    "type": "function",
    "name": "get_time",
    "description": "The current time in a time zone.",
    "parameters": ZONE_SCHEMA,
}
ALLOWED = ("get_time", "set_units")  # two of the three tools; never get_weather
ALLOWED_SCHEMAS = {"get_time": ZONE_SCHEMA, "set_units": UNITS_SCHEMA}
# Each asks for the tool that is not allowed, or for none in particular.
ALLOWED_ASKS = [ASK, "What time is it in Tokyo? Use a tool.", "Hello!"]


def _allowed(mode: str, names: tuple[str, ...] = ALLOWED) -> Any:
    return {
        "type": "allowed_tools",
        "mode": mode,
        "tools": [{"type": "function", "name": n} for n in names],
    }


def _allowed_call(item: Any) -> None:
    """``item`` is a completed call of an allowed tool whose arguments match its schema."""
    assert isinstance(item, ResponseFunctionToolCall), item
    assert item.status == "completed" and item.call_id and item.name in ALLOWED, item
    jsonschema.validate(json.loads(item.arguments), ALLOWED_SCHEMAS[item.name])


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_allowed_tools_required_calls_one_of_them(client: openai.OpenAI, stream: bool) -> None:
    """``allowed_tools`` in mode ``required`` over two of three tools: whatever is asked
    (the third tool's question too), the answer is one call of an allowed tool, with
    arguments valid against its schema; the answer echoes the choice."""
    for ask in ALLOWED_ASKS:
        kwargs: Any = {"tools": [WEATHER, TIME, UNITS], "tool_choice": _allowed("required")}
        if stream:
            events = _stream(client, input=ask, **kwargs)
            assert not [e for e in events if e.type == "response.output_text.delta"]
            final = events[-1].response
        else:
            final = client.responses.create(
                model="smollm2", input=ask, max_output_tokens=40, temperature=0, **kwargs
            )
        assert final.status == "completed", ask
        (item,) = final.output
        _allowed_call(item)
        choice = final.tool_choice
        assert choice.type == "allowed_tools" and choice.mode == "required"  # type: ignore[union-attr]
        assert [t["name"] for t in choice.tools] == list(ALLOWED)  # type: ignore[union-attr]
        assert [t.name for t in final.tools] == ["get_weather", "get_time", "set_units"]  # type: ignore[union-attr]


def test_allowed_tools_auto_calls_one_of_them_or_answers_text(client: openai.OpenAI) -> None:
    """``allowed_tools`` in mode ``auto``: each answer, whole and streamed, is text or
    calls of the allowed tools only (the earlier turns, which called the tool that is
    not allowed, are followed only as far as the grammar lets them)."""
    tools: Any = [BRIEF_WEATHER, TIME, UNITS]
    for stream in (False, True):
        kwargs: Any = {"tools": tools, "tool_choice": _allowed("auto")}
        if stream:
            final = _stream(client, input=FEW_SHOT_CALLS, **kwargs)[-1].response
        else:
            final = client.responses.create(
                model="smollm2",
                input=FEW_SHOT_CALLS,
                max_output_tokens=40,
                temperature=0,
                **kwargs,
            )
        assert final.output
        for item in final.output:
            if isinstance(item, ResponseFunctionToolCall):
                assert final.status == "completed"
                _allowed_call(item)
            else:
                assert isinstance(item, ResponseOutputMessage)
                assert item.content[0].text.strip()  # type: ignore[union-attr]


def test_allowed_tools_naming_another_function_is_a_400(client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as info:
        client.responses.create(
            model="smollm2",
            input="Hi",
            tools=[WEATHER, TIME],  # type: ignore[list-item]
            tool_choice=_allowed("required", ("get_time", "set_units")),
            max_output_tokens=2,
        )
    assert info.value.status_code == 400 and info.value.param == "tool_choice"
    assert info.value.code == "invalid_request"


def _earlier_call(call_id: str, city: str) -> dict[str, Any]:
    arguments = json.dumps({"city": city})
    return {
        "type": "function_call",
        "call_id": call_id,
        "name": "get_weather",
        "arguments": arguments,
    }


# Earlier turns that called the tool (written into the generic format's call objects for
# the template): greedy SmolLM2 follows them and calls it again.
FEW_SHOT_CALLS = [
    {"role": "user", "content": "What is the weather in London? Use the tool."},
    _earlier_call("call_1", "London"),
    {"role": "user", "content": "What is the weather in Rome? Use the tool."},
    _earlier_call("call_2", "Rome"),
    {"role": "user", "content": ASK},
]
BRIEF_WEATHER = {
    "type": "function",
    "name": "get_weather",
    "description": "Current weather",
    "parameters": CITY_SCHEMA,
}


def test_auto_calls_in_the_generic_format_whole_and_streamed(client: openai.OpenAI) -> None:
    """``auto`` where the model does call: the generic format's call object becomes a
    ``function_call`` item; streamed, it is sent whole once the object is complete."""
    whole = client.responses.create(
        model="smollm2",
        input=FEW_SHOT_CALLS,  # type: ignore[arg-type]
        tools=[BRIEF_WEATHER],  # type: ignore[list-item]
        max_output_tokens=40,
        temperature=0,
    )
    assert [o.type for o in whole.output] == ["function_call"], whole.output
    _valid_call(whole.output[0])
    events = _stream(client, FEW_SHOT_CALLS, tools=[BRIEF_WEATHER])
    kinds = [e.type for e in events]
    assert kinds == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.function_call_arguments.delta",
        "response.function_call_arguments.done",
        "response.output_item.done",
        "response.completed",
    ]
    call = _valid_call(events[-2].item)
    assert call.arguments == whole.output[0].arguments  # type: ignore[union-attr]
    assert events[-1].response.output == [call]


BAD = [
    ({"tools": [{"type": "web_search"}]}, "tools[0].type", "web_search"),
    ({"tools": [{"type": "file_search", "vector_store_ids": ["vs_1"]}]}, "tools[0].type", None),
    (
        {"tools": [WEATHER, {"type": "mcp", "server_label": "x", "server_url": "http://x"}]},
        "tools[1].type",
        "mcp",
    ),
    ({"tools": [{"type": "computer_use_preview"}]}, "tools[0].type", "computer_use_preview"),
    ({"tools": [{"type": "function", "name": "f", "nope": 1}]}, "tools[0].nope", None),
    ({"tools": [{"type": "function", "name": "bad name!"}]}, "tools[0].name", None),
    ({"tools": [WEATHER, WEATHER]}, "tools", "unique"),
    (
        {"tools": [{"type": "function", "name": f"f{i}"} for i in range(lim.MAX_TOOLS + 1)]},
        "tools",
        "too many tools",
    ),
    ({"tools": [WEATHER], "tool_choice": {"type": "web_search_preview"}}, "tool_choice", None),
    (
        {"tools": [WEATHER], "tool_choice": {"type": "function", "name": "other"}},
        "tool_choice",
        None,
    ),
    (
        {"tools": [WEATHER], "tool_choice": {"type": "allowed_tools", "mode": "auto", "tools": []}},
        "tool_choice",
        None,
    ),
    (
        {
            "tools": [WEATHER],
            "tool_choice": {"type": "allowed_tools", "mode": "auto", "tools": [{"type": "mcp"}]},
        },
        "tool_choice",
        None,
    ),
    ({"tool_choice": _allowed("auto", ("get_weather",))}, "tool_choice", None),
    (
        {"tools": [WEATHER], "tool_choice": FORCED, "text": {"format": {"type": "json_object"}}},
        "text.format",
        None,
    ),
    ({"max_tool_calls": 0}, "max_tool_calls", None),
    ({"input": [{"type": "reasoning", "summary": []}]}, "input[0].type", "reasoning"),
    (
        {"input": [{"type": "function_call", "name": "f", "arguments": "{}"}]},
        "input[0].call_id",
        None,
    ),
    ({"input": [{"type": "function_call_output", "call_id": "c"}]}, "input[0].output", None),
    (
        {
            "input": [
                {
                    "type": "function_call_output",
                    "call_id": "c",
                    "output": [{"type": "input_image"}],
                }
            ]
        },
        "input[0].output[0]",
        None,
    ),
]


@pytest.mark.parametrize(("extra", "param", "named"), BAD, ids=[p for _, p, _ in BAD])
def test_what_cannot_be_honoured_is_a_400_naming_it(
    llm: ServerProcess, extra: dict[str, Any], param: str, named: str | None
) -> None:
    body = {"model": "smollm2", "input": "Hi", "max_output_tokens": 2, **extra}
    resp = httpx.post(llm.url + "/v1/responses", json=body, timeout=model_scaled(60))
    assert resp.status_code == 400, resp.text
    error = resp.json()["error"]
    assert error["param"] == param
    if named is not None:
        assert named in error["message"]
    _wait_idle(llm.url, "smollm2")


def test_sdk_sees_an_unsupported_tool_type(client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as info:
        client.responses.create(model="smollm2", input="Hi", tools=[{"type": "web_search"}])
    assert info.value.param == "tools[0].type"
    assert "web_search" in str(info.value)
