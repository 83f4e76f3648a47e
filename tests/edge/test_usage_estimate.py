"""The token estimate of a relayed stream whose upstream reports no usage, sans I/O:
one token per non-empty generated string a chunk carries (``DeltaCounter``), on reads
cut anywhere; and the request body without the usage splice (``Rewritten.unasked``)."""

from __future__ import annotations

import json

from zeroserve import metrics
from zeroserve.app.relay._deltas import DeltaCounter
from zeroserve.app.relay._rewrite import rewrite_body


def event(obj: object) -> bytes:
    return b"data: " + json.dumps(obj).encode() + b"\n\n"


def delta(d: dict[str, object], **choice: object) -> bytes:
    return event({"id": "c", "choices": [{"index": 0, "delta": d, **choice}]})


# Counted: 2 contents, 1 reasoning_content, 1 reasoning, 1 tool call's arguments, 2 texts.
# Not: the empty first content, a null one, logprobs' "content" array, the escaped
# '"content": "x"' inside a string, the finish chunk, [DONE].
STREAM = b"".join(
    [
        delta({"role": "assistant", "content": ""}),
        delta({"reasoning_content": "think"}),
        delta({"reasoning": "more"}),
        delta(
            {"content": 'say "content": "x"'},
            logprobs={"content": [{"token": "say", "logprob": -1.0, "bytes": [115]}]},
        ),
        delta({"content": None, "tool_calls": [{"index": 0, "function": {"arguments": "{"}}]}),
        delta({"content": "\u00e9\\"}),
        event({"id": "c", "choices": [{"index": 0, "text": "a"}, {"index": 1, "text": "b"}]}),
        delta({}, finish_reason="stop"),
        b"data: [DONE]\n\n",
    ]
)
EXPECTED = 7


def count(parts: list[bytes]) -> DeltaCounter:
    counter = DeltaCounter()
    for part in parts:
        counter.feed(memoryview(part))
    return counter


def test_one_token_per_generated_string_however_the_reads_cut_the_bytes() -> None:
    assert count([STREAM]).tokens == EXPECTED
    for cut in range(len(STREAM) + 1):
        for second in range(cut, min(len(STREAM), cut + 40) + 1, 3):
            parts = [STREAM[:cut], STREAM[cut:second], STREAM[second:]]
            assert count(parts).tokens == EXPECTED, (cut, second)


def test_reads_of_one_byte_each() -> None:
    before = metrics.copied_bytes("relay_deltas")
    counter = count([STREAM[i : i + 1] for i in range(len(STREAM))])
    assert counter.tokens == EXPECTED
    # A key cut by a read is carried over (a copy, bounded), nothing else.
    assert metrics.copied_bytes("relay_deltas") > before


def test_whole_reads_copy_nothing() -> None:
    before = metrics.copied_bytes("relay_deltas")
    events = STREAM.split(b"\n\n")
    counter = count([e + b"\n\n" for e in events if e])
    assert counter.tokens == EXPECTED
    assert metrics.copied_bytes("relay_deltas") == before


def test_a_usage_the_upstream_sends_anyway_wins_once_larger() -> None:
    usage = event({"choices": [], "usage": {"prompt_tokens": 9, "completion_tokens": 7}})
    assert count([STREAM, usage]).tokens == 16
    small = event({"choices": [], "usage": {"total_tokens": 2}})
    assert count([STREAM, small]).tokens == EXPECTED


def test_the_body_without_the_splice_is_the_clients_or_only_its_model_rewritten() -> None:
    body = b'{"model":"g","stream":true,"messages":[]}'
    out = rewrite_body(memoryview(body), model=None, ask_usage=True)
    assert out.asked_usage and out.unasked is None  # the client's body as it is
    assert json.loads(b"".join(out.body or [])).get("stream_options") == {"include_usage": True}
    out = rewrite_body(memoryview(body), model="echo", ask_usage=True)
    assert out.asked_usage and out.unasked is not None
    assert json.loads(b"".join(out.unasked)) == {**json.loads(body), "model": "echo"}
    assert all(isinstance(b, memoryview | bytes) for b in out.unasked)
    asked = json.loads(b'{"model":"g","stream":true,"stream_options":{"include_usage":true}}')
    out = rewrite_body(memoryview(json.dumps(asked).encode()), model=None, ask_usage=True)
    assert not out.asked_usage and out.unasked is None
