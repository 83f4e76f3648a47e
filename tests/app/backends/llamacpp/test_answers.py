"""Answers made from a llama.cpp engine's chunks, everything after the engine real: the
runtime's slots run a scripted engine call in a real thread, ``EngineOutput`` decodes its
chunks, and the front ends write them. The chunks are llama.cpp's, as a model with a
native tool template writes them (SmolLM2's template has none, so the real engine never
makes them here; the real-model comparisons are in ``tests/models``)."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from typing import Any

import msgspec
import openai
from openai.types.responses import (
    ResponseFunctionToolCall,
    ResponseOutputMessage,
    ResponseStreamEvent,
)
from pydantic import TypeAdapter

from zeroserve.app.backends.llamacpp.output import EngineOutput
from zeroserve.app.chat import Choices, Output, QueuedChoice
from zeroserve.app.limits import ApiLimits
from zeroserve.app.openai.chat import ChatCompletions, Completions
from zeroserve.app.openai.responses import Responses
from zeroserve.app.response import Response
from zeroserve.runtime import SlotPool, Ticket
from zeroserve.runtime.admission import Admission

WEATHER = {
    "type": "function",
    "name": "get_weather",
    "description": "The weather.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
}


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


def _engine(
    scripts: list[list[dict[str, Any]]],
) -> Callable[[bytes, Callable[[bytes], bool]], None]:
    """A blocking engine call that answers request ``i`` (its payload) with ``scripts[i]``."""

    def call(payload: bytes, on_chunk: Callable[[bytes], bool]) -> None:
        for c in scripts[int(payload)]:
            if on_chunk(msgspec.json.encode(c)):
                return

    return call


def _choices(pool: SlotPool, scripts: list[list[dict[str, Any]]]) -> tuple[Choices, Admission]:
    adm = Admission("served", 8, pool.clock)
    call = _engine(scripts)

    def start(index: int, ticket: Ticket) -> Output:
        stream = pool.stream(ticket, call, b"%d" % index, deadline=time.monotonic() + 30)
        return EngineOutput(index, stream, "served", count_prompt=index == 0)

    return Choices([QueuedChoice(i, adm.admit(), start) for i in range(len(scripts))]), adm


def _run(coro_fn: Callable[[SlotPool], Any]) -> Any:
    async def main() -> Any:
        pool = SlotPool("served", 2, byte_cap=1 << 20, clock=time.monotonic)
        try:
            return await coro_fn(pool)
        finally:
            pool.close()

    return asyncio.run(main())


def test_native_tool_call_deltas_make_one_call() -> None:
    head = {
        "index": 0,
        "id": "call_a",
        "type": "function",
        "function": {"name": "get_weather", "arguments": ""},
    }
    script = [
        _chunk({"role": "assistant", "content": None}),
        _chunk({"tool_calls": [head]}),
        _chunk(_call_delta(0, function={"arguments": '{"city":'})),
        _chunk(_call_delta(0, function={"arguments": '"Paris"}'})),
        _chunk({}, "tool_calls"),
        {"choices": [], "usage": {"prompt_tokens": 9, "completion_tokens": 5}},
    ]
    api = ChatCompletions(ApiLimits())
    chat = api.parse(memoryview(b'{"model":"served","messages":[{"role":"user","content":"x"}]}'))

    async def go(pool: SlotPool) -> Response:
        choices, adm = _choices(pool, [script])
        resp = await api._whole(choices, chat, "chatcmpl-1", 7)
        assert adm.statistics().in_flight == 0
        return resp

    out = json.loads(b"".join(_run(go).body))
    assert out["model"] == "served" and out["object"] == "chat.completion"
    (choice,) = out["choices"]
    assert choice["finish_reason"] == "tool_calls" and choice["logprobs"] is None
    assert choice["message"] == {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": "call_a",
                "type": "function",
                "function": {"name": "get_weather", "arguments": '{"city":"Paris"}'},
            }
        ],
    }
    assert out["usage"] == {"prompt_tokens": 9, "completion_tokens": 5, "total_tokens": 14}


def test_choices_are_numbered_and_the_prompt_counted_once() -> None:
    def script(t: str) -> list[dict[str, Any]]:
        return [
            {
                "choices": [
                    {
                        "text": t,
                        "index": 0,
                        "logprobs": {"content": [{"token": t, "logprob": -1.0}]},
                    }
                ]
            },
            {
                "choices": [{"text": "", "index": 0, "finish_reason": "length"}],
                "usage": {
                    "prompt_tokens": 4,
                    "completion_tokens": 1,
                    "prompt_tokens_details": {"cached_tokens": 3},
                },
            },
        ]

    api = Completions(ApiLimits())
    chat = api.parse(memoryview(b'{"model":"served","prompt":"x","n":2,"logprobs":0}'))

    async def go(pool: SlotPool) -> Response:
        choices, _ = _choices(pool, [script("a"), script("b")])
        return await api._whole(choices, chat, "cmpl-1", 7)

    out = json.loads(b"".join(_run(go).body))
    assert out["object"] == "text_completion"
    assert [(c["index"], c["text"], c["finish_reason"]) for c in out["choices"]] == [
        (0, "a", "length"),
        (1, "b", "length"),
    ]
    assert out["choices"][1]["logprobs"] == {"content": [{"token": "b", "logprob": -1.0}]}
    assert out["usage"] == {
        "prompt_tokens": 4,
        "completion_tokens": 2,
        "total_tokens": 6,
        "prompt_tokens_details": {"cached_tokens": 3},
    }


def _responses_chat(stream: bool) -> Any:
    body = {"model": "served", "input": "hi", "tools": [WEATHER], "stream": stream}
    api = Responses(ApiLimits())
    return api, api.parse(memoryview(msgspec.json.encode(body)))


def test_native_calls_whole() -> None:
    api, chat = _responses_chat(stream=False)

    async def go(pool: SlotPool) -> Response:
        choices, _ = _choices(pool, [NATIVE])
        resp = api.respond(choices, chat, None)  # type: ignore[arg-type]
        return await resp  # type: ignore[no-any-return, misc]

    out = openai.types.responses.Response.model_validate_json(b"".join(_run(go).body))
    message, one, two = out.output
    assert isinstance(message, ResponseOutputMessage) and out.output_text == "Checking."
    assert isinstance(one, ResponseFunctionToolCall) and isinstance(two, ResponseFunctionToolCall)
    assert (one.call_id, one.arguments) == ("n1", '{"city": "Paris"}')
    assert (two.call_id, two.arguments) == ("n2", '{"city": "Rome"}')
    assert out.model == "served" and out.usage is not None and out.usage.output_tokens == 9


def test_native_calls_streamed() -> None:
    api, chat = _responses_chat(stream=True)

    async def go(pool: SlotPool) -> list[bytes]:
        choices, adm = _choices(pool, [NATIVE])
        resp = api.respond(choices, chat, None)  # type: ignore[arg-type]
        out: list[bytes] = []
        try:
            while True:
                out.append(await resp.pieces.__anext__())
        except StopAsyncIteration:
            pass
        await resp.pieces.aclose()
        assert adm.statistics().in_flight == 0
        return out

    adapter: Any = TypeAdapter(ResponseStreamEvent)
    parsed = []
    for raw in _run(go):
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
