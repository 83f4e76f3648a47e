"""The whole-answer assembly of engine-backed models (app/engine_answers.py), sans I/O:
the body rewrite that asks the engine for a stream, and answers put together from chunks
in the shapes llama.cpp's engine writes (native tool-call deltas included, which
SmolLM2's template cannot produce; the real-model comparison is in
``test_llamacpp_whole.py``)."""

from __future__ import annotations

import json

import msgspec

from zeroserve.app.engine_answers import Collected, streamed, whole_answer
from zeroserve.app.openai import schemas as s


def test_streamed_sets_stream_and_usage_where_they_are_or_not() -> None:
    for body in (
        {"model": "m", "messages": [{"role": "user", "content": "stream"}]},
        {"model": "m", "stream": False, "messages": []},
        {"stream_options": {"include_usage": False}, "model": "m", "stream": False},
    ):
        raw = json.dumps(body).encode()
        out = json.loads(streamed(raw))
        assert out["stream"] is True
        assert out["stream_options"] == {"include_usage": True}
        assert {k: v for k, v in out.items() if not k.startswith("stream")} == {
            k: v for k, v in body.items() if not k.startswith("stream")
        }


def _collected(chunks: list[dict[str, object]]) -> Collected:
    out = Collected()
    for c in chunks:
        out.add(s.engine_chunk_decoder.decode(msgspec.json.encode(c)))
    return out


def _chunk(choice: dict[str, object], **top: object) -> dict[str, object]:
    return {
        "id": "chatcmpl-1",
        "created": 7,
        "object": "chat.completion.chunk",
        "model": "path/to/file.gguf",
        "choices": [choice],
        **top,
    }


def test_native_tool_call_deltas_make_one_call() -> None:
    head = {
        "index": 0,
        "id": "call_a",
        "type": "function",
        "function": {"name": "get_weather", "arguments": ""},
    }
    answer = _collected(
        [
            _chunk({"index": 0, "delta": {"role": "assistant", "content": None}}),
            _chunk({"index": 0, "delta": {"tool_calls": [head]}}),
            _chunk(
                {
                    "index": 0,
                    "delta": {"tool_calls": [{"index": 0, "function": {"arguments": '{"city":'}}]},
                }
            ),
            _chunk(
                {
                    "index": 0,
                    "delta": {"tool_calls": [{"index": 0, "function": {"arguments": '"Paris"}'}}]},
                }
            ),
            _chunk({"index": 0, "delta": {}, "finish_reason": "tool_calls"}),
            {
                "id": "chatcmpl-1",
                "choices": [],
                "usage": {"prompt_tokens": 9, "completion_tokens": 5, "total_tokens": 14},
            },
        ]
    )
    out = json.loads(whole_answer([answer], "served", chat=True))
    assert out["model"] == "served" and out["object"] == "chat.completion"
    assert (out["id"], out["created"]) == ("chatcmpl-1", 7)
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
    answers = [
        _collected(
            [
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
                        "total_tokens": 5,
                        "prompt_tokens_details": {"cached_tokens": 3},
                    },
                },
            ]
        )
        for t in ("a", "b")
    ]
    out = json.loads(whole_answer(answers, "served", chat=False))
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
