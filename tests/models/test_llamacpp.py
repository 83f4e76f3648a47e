"""The ``llamacpp`` backend and the built-in ``smollm2``: real SmolLM2 through the real
server, the official ``openai`` SDK (sync, async, streaming) and raw sockets.

One server process serves three engines of the same GGUF: ``smollm2`` (the built-in, two
slots), ``one`` (one slot: a stopped generation must free it) and ``brief`` (one slot, a
one-second deadline). Answers are kept to a few tokens: the machine has two shared cores.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import jsonschema
import openai
import pytest

from tests.runtime.helpers import thread_nices
from tests.support import ROOT, ServerProcess, model_scaled, scaled, start_server, wait_until
from tests.support.smollm2 import require_llamacpp, smollm2_arg
from zeroserve.models.llamacpp import SMOLLM2_SHA256, smollm2_path
from zeroserve.runtime.priority import DEFAULT_MODEL_NICE

# Waits on smollm2's decode, below the loop: bounds by model_slowdown (tests/conftest.py).
pytestmark = pytest.mark.niced

require_llamacpp()

GGUF = smollm2_path()
# Seconds within which a poll of the server's state must see what it waits for.
POLL_S = 30.0
HELPFUL = {"role": "system", "content": "You are a helpful assistant."}
# The ``one`` engine's own default system prompt (the ``system_prompt`` option, as the
# spec's query writes it), and the same as a client's system message.
SYSTEM_OPTION = "You+answer+in+one+short+sentence."
SHORT = {"role": "system", "content": "You answer in one short sentence."}
PYFILE = {"role": "user", "content": "How do I open a file in Python?"}
FRANCE = {"role": "user", "content": "What is the capital of France?"}
WEATHER = {"role": "user", "content": "What is the weather in Paris?"}
CITY_SCHEMA = {
    "type": "object",
    "properties": {"city": {"type": "string"}},
    "required": ["city"],
    "additionalProperties": False,
}
# Bans SmolLM2's end tokens (<|im_end|> 2, <|endoftext|> 0): the answer runs to max_tokens,
# so a generation surely outlives a deadline or a disconnect.
ENDLESS = {"logit_bias": {"2": -100, "0": -100}}
WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather",
        "parameters": CITY_SCHEMA,
    },
}
# An earlier turn's call of the weather tool, and its result.
WEATHER_ROUND_TRIP: list[dict[str, Any]] = [
    {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": "call_1",
                "type": "function",
                "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
            }
        ],
    },
    {"role": "tool", "tool_call_id": "call_1", "content": "sunny, 21 C"},
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
        f"one=llamacpp:{GGUF}?parallel=1&n_ctx=1024&system_prompt={SYSTEM_OPTION}",
        "--model",
        f"brief=llamacpp:{GGUF}?parallel=1&n_ctx=1024&timeout={BRIEF_S:g}",
    )
    yield server
    assert server.stop() == 0


def test_the_engines_threads_run_below_the_event_loop(llm: ServerProcess) -> None:
    """The engines start their decode threads in load(), on a thread lowered for it:
    they inherit its nice value; the event loop's thread keeps the process's."""
    nices = thread_nices(llm.proc.pid)
    assert nices["main"] == [0]
    others = [n for name, ns in nices.items() if name != "main" for n in ns]
    assert others.count(DEFAULT_MODEL_NICE) >= 3, nices  # at least one per engine


@pytest.fixture
def client(llm: ServerProcess) -> Iterator[openai.OpenAI]:
    with llm.client() as c:
        yield c


def _metric(url: str, name: str, model: str) -> float:
    text = httpx.get(url + "/metrics").text
    m = re.search(rf'^{name}\{{name="{model}"\}} (\S+)$', text, re.M)
    m = m or re.search(rf'^{name}\{{model="{model}"\}} (\S+)$', text, re.M)
    return float(m.group(1)) if m else 0.0


def _wait_idle(url: str, model: str) -> None:
    """Poll (bounded) until the model has no slot busy and nobody waiting for one."""
    wait_until(
        lambda: (
            _metric(url, "zeroserve_engine_active", model) == 0
            and _metric(url, "zeroserve_engine_queued", model) == 0
        ),
        POLL_S,
        f"{model} to have no busy slot and no one waiting",
        interval=0.05,
        model=True,
    )


# -- answers --------------------------------------------------------------------------------
def test_greedy_answer_is_coherent(client: openai.OpenAI) -> None:
    r = client.chat.completions.create(
        model="smollm2", messages=[HELPFUL, FRANCE], max_tokens=12, temperature=0
    )
    assert "Paris" in (r.choices[0].message.content or "")
    assert r.model == "smollm2"
    assert r.usage is not None and r.usage.completion_tokens > 0


def test_greedy_answer_without_a_system_message_is_coherent(client: openai.OpenAI) -> None:
    """smollm2's default system prompt applies when the client sends none: the answer
    is the one the same system message gives, and it is right."""
    bare = client.chat.completions.create(
        model="smollm2", messages=[FRANCE], max_tokens=12, temperature=0
    )
    told = client.chat.completions.create(
        model="smollm2", messages=[HELPFUL, FRANCE], max_tokens=12, temperature=0
    )
    assert "Paris" in (bare.choices[0].message.content or "")
    assert bare.choices[0].message.content == told.choices[0].message.content
    assert bare.usage is not None and told.usage is not None
    assert bare.usage.prompt_tokens == told.usage.prompt_tokens
    code = client.chat.completions.create(
        model="smollm2", messages=[PYFILE], max_tokens=24, temperature=0
    )
    assert "open(" in (code.choices[0].message.content or "")


def test_a_client_system_message_replaces_the_default(client: openai.OpenAI) -> None:
    """The default is only a default: a client's own system message is the only one the
    engine sees (not the default and then the client's)."""
    pirate = {"role": "system", "content": "You are a pirate."}
    own = client.chat.completions.create(
        model="smollm2", messages=[pirate, FRANCE], max_tokens=1, temperature=0
    )
    both = client.chat.completions.create(
        model="smollm2", messages=[HELPFUL, pirate, FRANCE], max_tokens=1, temperature=0
    )
    assert own.usage is not None and both.usage is not None
    assert own.usage.prompt_tokens < both.usage.prompt_tokens


def test_system_prompt_option_sets_a_models_default(client: openai.OpenAI) -> None:
    """``system_prompt=`` on a llamacpp spec: a chat without a system message is
    rendered with it, exactly as if the client had sent it; a chat with one is not."""
    bare = client.chat.completions.create(
        model="one", messages=[FRANCE], max_tokens=1, temperature=0
    )
    told = client.chat.completions.create(
        model="one", messages=[SHORT, FRANCE], max_tokens=1, temperature=0
    )
    other = client.chat.completions.create(
        model="one", messages=[HELPFUL, FRANCE], max_tokens=1, temperature=0
    )
    assert bare.usage is not None and told.usage is not None and other.usage is not None
    assert bare.usage.prompt_tokens == told.usage.prompt_tokens
    assert other.usage.prompt_tokens != told.usage.prompt_tokens


def test_stream_names_the_served_model_never_the_file(llm: ServerProcess) -> None:
    with llm.client() as c:
        chunks = list(
            c.chat.completions.create(
                model="smollm2",
                messages=[HELPFUL, FRANCE],
                max_tokens=8,
                temperature=0,
                stream=True,
                stream_options={"include_usage": True},
            )
        )
    assert chunks and all(ch.model == "smollm2" for ch in chunks)
    text = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
    assert "Paris" in text
    reasons = [ch.choices[0].finish_reason for ch in chunks if ch.choices]
    assert reasons[-1] in ("stop", "length")
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens > 0
    raw = httpx.post(
        llm.url + "/v1/chat/completions",
        json={"model": "smollm2", "messages": [FRANCE], "max_tokens": 3, "stream": True},
    ).text
    assert ".gguf" not in raw and GGUF not in raw
    assert raw.rstrip().endswith("data: [DONE]")


def test_async_completions(llm: ServerProcess) -> None:
    async def go() -> str:
        async with llm.async_client() as c:
            r = await c.completions.create(
                model="smollm2", prompt="The capital of France is", max_tokens=4, temperature=0
            )
            return r.choices[0].text

    assert "Paris" in asyncio.run(go())


def test_json_schema_output_validates(client: openai.OpenAI) -> None:
    r = client.chat.completions.create(
        model="smollm2",
        messages=[WEATHER],
        max_tokens=30,
        temperature=0,
        response_format={
            "type": "json_schema",
            "json_schema": {"name": "place", "strict": True, "schema": CITY_SCHEMA},
        },
    )
    obj = json.loads(r.choices[0].message.content or "")
    jsonschema.validate(obj, CITY_SCHEMA)


def test_forced_tool_call_validates(client: openai.OpenAI) -> None:
    r = client.chat.completions.create(
        model="smollm2",
        messages=[WEATHER],
        max_tokens=30,
        temperature=0,
        tools=[WEATHER_TOOL],
        tool_choice="required",  # type: ignore[list-item]
    )
    choice = r.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content is None
    (call,) = choice.message.tool_calls or []
    assert call.type == "function" and call.function.name == "get_weather"  # type: ignore[union-attr]
    jsonschema.validate(json.loads(call.function.arguments), CITY_SCHEMA)  # type: ignore[union-attr]


def test_forced_tool_call_streamed_deltas(client: openai.OpenAI) -> None:
    stream = client.chat.completions.create(
        model="smollm2",
        messages=[WEATHER],
        max_tokens=30,
        temperature=0,
        stream=True,
        tools=[WEATHER_TOOL],  # type: ignore[list-item]
        tool_choice={"type": "function", "function": {"name": "get_weather"}},
    )
    chunks = list(stream)
    first = chunks[0].choices[0].delta
    assert first.role == "assistant" and first.tool_calls
    head = first.tool_calls[0]
    assert head.index == 0 and head.id and head.type == "function"
    assert head.function is not None and head.function.name == "get_weather"
    args = "".join(
        tc.function.arguments or ""
        for ch in chunks
        for tc in (ch.choices[0].delta.tool_calls or [] if ch.choices else [])
        if tc.function is not None
    )
    jsonschema.validate(json.loads(args), CITY_SCHEMA)
    assert chunks[-1].choices[0].finish_reason == "tool_calls"


PARIS_TOOL = {"role": "user", "content": "What is the weather in Paris? Use the tool."}


def _check_auto_message(message: Any, finish_reason: str | None) -> bool:
    """Assert an answer to tools with ``auto`` is a well-formed call or text; True for
    a call."""
    if message.tool_calls:
        assert finish_reason == "tool_calls"
        assert message.content is None
        for call in message.tool_calls:
            assert call.id and call.type == "function"
            assert call.function.name == "get_weather"
            jsonschema.validate(json.loads(call.function.arguments), CITY_SCHEMA)
        return True
    assert finish_reason in ("stop", "length")
    assert isinstance(message.content, str) and message.content.strip()
    assert not message.content.lstrip().startswith('{"tool_calls"') or finish_reason == "length"
    return False


def test_auto_tools_answer_is_a_valid_call_or_text(client: openai.OpenAI) -> None:
    r = client.chat.completions.create(
        model="smollm2",
        messages=[PARIS_TOOL],
        max_tokens=40,
        temperature=0,
        tools=[WEATHER_TOOL],  # type: ignore[list-item]
        tool_choice="auto",
    )
    assert r.model == "smollm2" and r.object == "chat.completion"
    (choice,) = r.choices
    _check_auto_message(choice.message, choice.finish_reason)
    assert r.usage is not None and r.usage.completion_tokens > 0


def _streamed_message(chunks: list[Any]) -> tuple[Any, str | None]:
    """The message and finish reason a stream of chunks spells (as OpenAI clients
    rebuild it), after checking the stream's shape."""
    assert chunks[0].choices[0].delta.role == "assistant"
    assert len({c.id for c in chunks}) == 1 and all(c.model == "smollm2" for c in chunks)
    assert chunks[-1].choices == [] and chunks[-1].usage is not None
    text = ""
    calls: dict[int, dict[str, str]] = {}
    reason = None
    for ch in chunks[:-1]:
        (c,) = ch.choices
        text += c.delta.content or ""
        for tc in c.delta.tool_calls or []:
            slot = calls.setdefault(tc.index, {"id": "", "name": "", "arguments": ""})
            slot["id"] += tc.id or ""
            if tc.function is not None:
                slot["name"] += tc.function.name or ""
                slot["arguments"] += tc.function.arguments or ""
        if c.finish_reason is not None:
            assert reason is None, "one finish_reason per stream"
            reason = c.finish_reason
    assert not (text and calls), "an answer is a call or text, never both"
    message = openai.types.chat.ChatCompletionMessage(
        role="assistant",
        content=text or None,
        tool_calls=[
            {
                "id": v["id"],
                "type": "function",
                "function": {"name": v["name"], "arguments": v["arguments"]},
            }
            for _, v in sorted(calls.items())
        ]
        or None,
    )
    return message, reason


def test_auto_tools_streamed_is_a_valid_call_or_text(client: openai.OpenAI) -> None:
    stream = client.chat.completions.create(
        model="smollm2",
        messages=[PARIS_TOOL],
        max_tokens=40,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
        tools=[WEATHER_TOOL],  # type: ignore[list-item]
        tool_choice="auto",
    )
    _check_auto_message(*_streamed_message(list(stream)))


# An enum: greedy SmolLM2 may run a free zone string on to max_tokens.
ZONE_SCHEMA = {
    "type": "object",
    "properties": {"zone": {"type": "string", "enum": ["UTC", "Asia/Tokyo", "Europe/Paris"]}},
    "required": ["zone"],
    "additionalProperties": False,
}
UNITS_SCHEMA = {
    "type": "object",
    "properties": {"unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
    "required": ["unit"],
}
THREE_TOOLS = [
    WEATHER_TOOL,
    {
        "type": "function",
        "function": {"name": "get_time", "description": "Time", "parameters": ZONE_SCHEMA},
    },
    {
        "type": "function",
        "function": {"name": "set_units", "description": "Units", "parameters": UNITS_SCHEMA},
    },
]
ALLOWED_SCHEMAS = {"get_time": ZONE_SCHEMA, "set_units": UNITS_SCHEMA}  # never get_weather
# Each asks for the tool that is not allowed, or for none in particular.
ALLOWED_ASKS = [PARIS_TOOL, {"role": "user", "content": "What time is it in Tokyo?"}, FRANCE]


def _allowed(mode: str, names: Any = tuple(ALLOWED_SCHEMAS)) -> Any:
    tools = [{"type": "function", "function": {"name": n}} for n in names]
    return {"type": "allowed_tools", "allowed_tools": {"mode": mode, "tools": tools}}


def _check_allowed_calls(message: Any) -> None:
    assert message.tool_calls and message.content is None, message
    for call in message.tool_calls:
        assert call.id and call.type == "function"
        assert call.function.name in ALLOWED_SCHEMAS, call
        jsonschema.validate(
            json.loads(call.function.arguments), ALLOWED_SCHEMAS[call.function.name]
        )


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_allowed_tools_required_calls_one_of_them(client: openai.OpenAI, stream: bool) -> None:
    """``allowed_tools`` in mode ``required`` over two of three tools: whatever is asked
    (the third tool's question too), the answer is a call of an allowed tool with
    arguments valid against its schema."""
    for ask in ALLOWED_ASKS:
        kwargs: Any = {
            "model": "smollm2",
            "messages": [ask],
            "max_tokens": 40,
            "temperature": 0,
            "tools": THREE_TOOLS,
            "tool_choice": _allowed("required"),
        }
        if stream:
            chunks = list(
                client.chat.completions.create(
                    stream=True, stream_options={"include_usage": True}, **kwargs
                )
            )
            message, reason = _streamed_message(chunks)
        else:
            (choice,) = client.chat.completions.create(**kwargs).choices
            message, reason = choice.message, choice.finish_reason
        assert reason == "tool_calls", ask
        _check_allowed_calls(message)
        assert len(message.tool_calls) == 1


def test_allowed_tools_auto_calls_one_of_them_or_answers_text(client: openai.OpenAI) -> None:
    """``allowed_tools`` in mode ``auto``: text, or calls of the allowed tools only
    (the earlier turns called the tool that is not allowed), whole and streamed."""
    kwargs: Any = {
        "model": "smollm2",
        "messages": FEW_SHOT_CALLS,
        "max_tokens": 40,
        "temperature": 0,
        "tools": THREE_TOOLS,
        "tool_choice": _allowed("auto"),
    }
    (choice,) = client.chat.completions.create(**kwargs).choices
    chunks = list(
        client.chat.completions.create(
            stream=True, stream_options={"include_usage": True}, **kwargs
        )
    )
    for message, reason in ((choice.message, choice.finish_reason), _streamed_message(chunks)):
        if message.tool_calls:
            assert reason == "tool_calls"
            _check_allowed_calls(message)
        else:
            assert reason in ("stop", "length")
            assert isinstance(message.content, str) and message.content.strip()
            assert not message.content.lstrip().startswith("{") or reason == "length"


def test_allowed_tools_naming_another_function_is_a_400(client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(
            model="smollm2",
            messages=[FRANCE],
            max_tokens=2,
            tools=THREE_TOOLS[:2],  # type: ignore[arg-type]
            tool_choice=_allowed("required"),  # set_units is not in tools
        )
    assert info.value.status_code == 400 and info.value.param == "tool_choice"
    assert info.value.code == "invalid_request"


def _earlier_call(ident: str, city: str) -> Any:
    return {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": ident,
                "type": "function",
                "function": {"name": "get_weather", "arguments": json.dumps({"city": city})},
            }
        ],
    }


# A conversation whose earlier turns called the tool (written into the generic format's
# call objects for the template): greedy SmolLM2 follows them and calls it again.
FEW_SHOT_CALLS = [
    {"role": "user", "content": "What is the weather in London? Use the tool."},
    _earlier_call("call_1", "London"),
    {"role": "user", "content": "What is the weather in Rome? Use the tool."},
    _earlier_call("call_2", "Rome"),
    PARIS_TOOL,
]


def test_auto_tools_call_in_the_generic_format(client: openai.OpenAI) -> None:
    r = client.chat.completions.create(
        model="smollm2",
        messages=FEW_SHOT_CALLS,  # type: ignore[arg-type]
        max_tokens=40,
        temperature=0,
        tools=[WEATHER_TOOL],  # type: ignore[list-item]
        tool_choice="auto",
    )
    (choice,) = r.choices
    assert _check_auto_message(choice.message, choice.finish_reason), "expected a call"


def test_auto_tools_call_streamed_in_the_generic_format(client: openai.OpenAI) -> None:
    stream = client.chat.completions.create(
        model="smollm2",
        messages=FEW_SHOT_CALLS,  # type: ignore[arg-type]
        max_tokens=40,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
        tools=[WEATHER_TOOL],  # type: ignore[list-item]
    )
    assert _check_auto_message(*_streamed_message(list(stream))), "expected a call"


def test_tools_without_tool_choice_mean_auto(client: openai.OpenAI) -> None:
    r = client.chat.completions.create(
        model="smollm2",
        messages=[HELPFUL, {"role": "user", "content": "Say hello."}],
        max_tokens=12,
        temperature=0,
        tools=[WEATHER_TOOL],  # type: ignore[list-item]
    )
    (choice,) = r.choices
    _check_auto_message(choice.message, choice.finish_reason)


def test_auto_tools_rewrites_earlier_calls(client: openai.OpenAI) -> None:
    """A conversation with an earlier call and its result, and tools again: answered."""
    r = client.chat.completions.create(
        model="smollm2",
        max_tokens=12,
        temperature=0,
        tools=[WEATHER_TOOL],  # type: ignore[list-item]
        messages=[
            PARIS_TOOL,
            *WEATHER_ROUND_TRIP,
        ],
    )
    (choice,) = r.choices
    _check_auto_message(choice.message, choice.finish_reason)


def test_tool_role_messages_are_accepted(client: openai.OpenAI) -> None:
    r = client.chat.completions.create(
        model="smollm2",
        max_tokens=6,
        temperature=0,
        messages=[
            WEATHER,
            *WEATHER_ROUND_TRIP,
        ],
    )
    assert r.choices[0].finish_reason in ("stop", "length")


def test_logprobs(client: openai.OpenAI) -> None:
    r = client.chat.completions.create(
        model="smollm2",
        messages=[FRANCE],
        max_tokens=3,
        temperature=0,
        logprobs=True,
        top_logprobs=2,
    )
    content = r.choices[0].logprobs.content  # type: ignore[union-attr]
    assert content and all(len(t.top_logprobs) == 2 and t.logprob <= 0 for t in content)


def test_n_choices(client: openai.OpenAI) -> None:
    r = client.chat.completions.create(
        model="smollm2", messages=[FRANCE], max_tokens=4, temperature=0.8, seed=1, n=2
    )
    assert [c.index for c in r.choices] == [0, 1]
    stream = client.chat.completions.create(
        model="smollm2",
        messages=[FRANCE],
        max_tokens=3,
        temperature=0.8,
        seed=1,
        n=2,
        stream=True,
    )
    indexes = {ch.choices[0].index for ch in stream if ch.choices}
    assert indexes == {0, 1}


def test_stop_strings(client: openai.OpenAI) -> None:
    r = client.chat.completions.create(
        model="smollm2", messages=[HELPFUL, FRANCE], max_tokens=12, temperature=0, stop=["Paris"]
    )
    assert "Paris" not in (r.choices[0].message.content or "")
    assert r.choices[0].finish_reason == "stop"


# -- bad input -------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("extra", "param", "code"),
    [
        ({"frobnicate": 1}, "frobnicate", "invalid_request"),
        (
            {
                "response_format": {
                    "type": "json_schema",
                    "json_schema": {"name": "x", "schema": {"type": "nope"}},
                }
            },
            "response_format",
            "invalid_request",
        ),
        (
            {
                "response_format": {
                    "type": "json_schema",
                    "json_schema": {
                        "name": "x",
                        "schema": {"type": "object", "description": "x" * (1 << 20)},
                    },
                }
            },
            "response_format",
            "invalid_request",
        ),
        ({"max_tokens": 100_000}, "max_tokens", "context_length_exceeded"),
        (
            {"messages": [{"role": "user", "content": "hello " * 3000}]},
            "messages",
            "context_length_exceeded",
        ),
        ({"tool_choice": "required"}, "tool_choice", "invalid_request"),
        # A conversation the chat template refuses (two assistant messages at the end),
        # long enough to be checked against the context through the engine's template
        # first: that refusal is the client's 400, not a 500 (found by the fuzz campaign).
        (
            {"messages": [{"role": "assistant", "content": "hello " * 400}] * 2},
            "messages",
            "invalid_request",
        ),
        # The generic path's count limits hold for the engine too (app/limits.py).
        ({"n": 10**6}, "n", "limit_exceeded"),
        ({"stop": ["x"] * 1000}, "stop", "limit_exceeded"),
        ({"messages": [FRANCE] * 100_000}, "messages", "limit_exceeded"),
        (
            {
                "tools": [WEATHER_TOOL],
                "tool_choice": {"type": "function", "function": {"name": "other"}},
            },
            "tool_choice",
            "invalid_request",
        ),
        (
            {
                "tools": [WEATHER_TOOL],
                "tool_choice": {
                    "type": "allowed_tools",
                    "allowed_tools": {"mode": "auto", "tools": []},
                },
            },
            "tool_choice.allowed_tools.tools",
            "invalid_request",
        ),
        (
            {
                "tools": [WEATHER_TOOL],
                "tool_choice": {
                    "type": "allowed_tools",
                    "allowed_tools": {"mode": "sometimes", "tools": [{"type": "function"}]},
                },
            },
            "tool_choice.allowed_tools.mode",
            "invalid_request",
        ),
        (
            {"tools": [WEATHER_TOOL], "response_format": {"type": "json_object"}},
            "response_format",
            "invalid_request",
        ),
        ({"tools": [WEATHER_TOOL], "tool_choice": "auto", "n": 2}, "n", "invalid_request"),
        (
            {
                "tools": [
                    {"type": "function", "function": {"name": "f", "parameters": {"type": 5}}}
                ],
                "tool_choice": "required",
            },
            "tools",
            "invalid_request",
        ),
    ],
)
def test_bad_input_is_a_400_and_leaks_nothing(
    llm: ServerProcess, extra: dict[str, object], param: str, code: str
) -> None:
    body = {"model": "one", "messages": [FRANCE], "max_tokens": 2, **extra}
    r = httpx.post(llm.url + "/v1/chat/completions", json=body, timeout=model_scaled(60))
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == param and err["code"] == code
    _wait_idle(llm.url, "one")
    ok = httpx.post(
        llm.url + "/v1/chat/completions",
        timeout=model_scaled(60),
        json={"model": "one", "messages": [FRANCE], "max_tokens": 1},
    )
    assert ok.status_code == 200


def test_harmless_fields_are_accepted(client: openai.OpenAI) -> None:
    r = client.chat.completions.create(
        model="smollm2",
        messages=[FRANCE],
        max_tokens=1,
        user="u-1",
        metadata={"k": "v"},
        store=False,
    )
    assert r.choices[0].finish_reason in ("stop", "length")


# -- cancellation and deadlines ---------------------------------------------------------------
def test_disconnect_frees_the_slot(llm: ServerProcess) -> None:
    """``one`` has one slot. A stream of up to 900 tokens is read for two chunks and then
    dropped: the slot must stop at once, so the next request is served and the model
    made far fewer tokens than asked."""
    before = _metric(llm.url, "zeroserve_generation_tokens_total", "one")
    body = {
        "model": "one",
        "messages": [FRANCE],
        "max_tokens": 900,
        "stream": True,
        "temperature": 1.0,
        **ENDLESS,
    }
    with (
        httpx.Client(timeout=model_scaled(60)) as c,
        c.stream("POST", llm.url + "/v1/chat/completions", json=body) as r,
    ):
        lines = r.iter_lines()
        got = 0
        for line in lines:
            if line.startswith("data: "):
                got += 1
                if got == 2:
                    break
    _wait_idle(llm.url, "one")
    r2 = httpx.post(
        llm.url + "/v1/chat/completions",
        timeout=model_scaled(60),
        json={"model": "one", "messages": [FRANCE], "max_tokens": 2},
    )
    assert r2.status_code == 200
    made = _metric(llm.url, "zeroserve_generation_tokens_total", "one") - before
    assert 0 < made < 300
    assert _metric(llm.url, "zeroserve_engine_aborted", "one") >= 1


def test_deadline_stops_the_generation(llm: ServerProcess) -> None:
    body = {
        "model": "brief",
        "messages": [FRANCE],
        "max_tokens": 900,
        "stream": True,
        "temperature": 1.0,
        **ENDLESS,
    }
    r = httpx.post(llm.url + "/v1/chat/completions", json=body, timeout=model_scaled(60))
    if r.status_code == 200:  # the deadline passed mid-stream: a final SSE error event
        events = [ln[6:] for ln in r.text.splitlines() if ln.startswith("data: ")]
        assert json.loads(events[-1])["error"]["code"] == "deadline_exceeded"
    else:
        assert r.status_code == 504
    _wait_idle(llm.url, "brief")
    ok = httpx.post(
        llm.url + "/v1/chat/completions",
        timeout=model_scaled(60),
        json={"model": "brief", "messages": [FRANCE], "max_tokens": 1},
    )
    assert ok.status_code == 200


# -- side doors --------------------------------------------------------------------------------
def _listening_ports(pid: int) -> set[int]:
    """TCP ports process ``pid`` listens on (from /proc: its socket inodes in LISTEN)."""
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            target = os.readlink(fd)
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    ports = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            f = line.split()
            if f[3] == "0A" and f[9] in inodes:
                ports.add(int(f[1].rsplit(":", 1)[1], 16))
    return ports


def test_no_side_door_accepts_inference(llm: ServerProcess) -> None:
    ports = _listening_ports(llm.proc.pid) - {llm.port}
    assert ports, "the engines' own HTTP servers should be found listening"
    body = {
        "model": "smollm2",
        "messages": [FRANCE],
        "max_tokens": 1,
        "prompt": "hi",
        "content": "hi",
    }
    for port in ports:
        base = f"http://127.0.0.1:{port}"
        for path in (
            "/v1/chat/completions",
            "/completion",
            "/v1/completions",
            "/tokenize",
            "/infill",
            "/v1/responses",
            "/v1/messages",
            "/slots",
        ):
            for headers in ({}, {"authorization": "Bearer guess"}):
                r = httpx.post(base + path, json=body, headers=headers, timeout=model_scaled(30))
                assert r.status_code == 401, (port, path, r.status_code)


# -- processes: signals, bad files ------------------------------------------------------------
def test_sigterm_drains_a_stream_while_smollm2_is_loaded(tmp_path: Path) -> None:
    # The drain's grace is the operator's bound on the slowest stream: scaled here, since
    # on a busy machine the niced decode threads (docs/decisions/0001-model-nice-levels.md)
    # can take longer than the default 30 s for the 12 tokens.
    config = tmp_path / "drain.toml"
    config.write_text(f"[timeouts]\ngraceful = {model_scaled(30.0)}\n")
    server = start_server("--config", str(config), "--model", smollm2_arg(parallel=1, n_ctx=512))
    try:
        body = {
            "model": "smollm2",
            "messages": [FRANCE],
            "max_tokens": 12,
            "stream": True,
            "temperature": 0,
        }
        with (
            httpx.Client(timeout=model_scaled(60)) as c,
            c.stream("POST", server.url + "/v1/chat/completions", json=body) as r,
        ):
            lines = r.iter_lines()
            first = next(ln for ln in lines if ln.startswith("data: "))
            assert "chat.completion.chunk" in first
            server.proc.send_signal(signal.SIGTERM)
            rest = [ln for ln in lines if ln.startswith("data: ")]
        assert rest[-1] == "data: [DONE]"
        finish = json.loads(rest[-2][6:])["choices"][0]["finish_reason"]
        assert finish in ("stop", "length")
        assert server.proc.wait(model_scaled(60)) == 0
    finally:
        server.stop()


def _serve_fails(spec: str) -> str:
    env = dict(
        os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])
    )
    proc = subprocess.run(
        [sys.executable, "-m", "zeroserve", "serve", "--port", "0", "--model", spec],
        capture_output=True,
        text=True,
        timeout=model_scaled(120),
        env=env,
        cwd=ROOT,
    )
    assert proc.returncode != 0
    return proc.stdout + proc.stderr


def test_missing_gguf_fails_at_start(tmp_path: Path) -> None:
    path = tmp_path / "absent.gguf"
    out = _serve_fails(f"m=llamacpp:{path}")
    assert str(path) in out and "not found" in out


def test_corrupt_gguf_fails_at_start(tmp_path: Path) -> None:
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"GGML" + os.urandom(64))
    out = _serve_fails(f"m=llamacpp:{bad}")
    assert str(bad) in out and "not a GGUF" in out
    truncated = tmp_path / "truncated.gguf"
    with open(GGUF, "rb") as f:
        truncated.write_bytes(f.read(1 << 16))
    out = _serve_fails(f"m=llamacpp:{truncated}?sha256={SMOLLM2_SHA256}")
    assert str(truncated) in out and "does not match" in out
    out = _serve_fails(f"m=llamacpp:{truncated}")  # no digest: the engine refuses it
    assert str(truncated) in out


def test_models_command_describes_smollm2() -> None:
    env = dict(
        os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])
    )
    out = subprocess.run(
        [sys.executable, "-m", "zeroserve", "models", "--model", "smollm2"],
        capture_output=True,
        text=True,
        timeout=model_scaled(60),
        env=env,
        cwd=ROOT,
        check=True,
    ).stdout
    assert out.startswith("smollm2") and "SmolLM2-135M-Instruct" in out
