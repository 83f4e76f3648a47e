"""The gateway asking a stream for its usage on the client's behalf, sans I/O: the body
rewrite (``rewrite_body``) and the filter that takes the usage chunk back out of the
relayed views (``UsageChunkFilter``), on reads cut anywhere."""

from __future__ import annotations

import json

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from zeroserve import metrics
from zeroserve.app.relay._rewrite import rewrite_body
from zeroserve.app.relay._strip import USAGE_EVENT_MAX_BYTES, UsageChunkFilter, is_usage_chunk
from zeroserve.app.relay._usage import UsageScanner

CONTENT = b'data: {"id":"c","choices":[{"index":0,"delta":{"content":"a \\"choices\\": []"}}],"usage":null}\n\n'
FINISH = (
    b'data: {"id":"c","choices":[{"index":0,"delta":{},"finish_reason":"length"}],"usage":null}\n\n'
)
USAGE = (
    b'data: {"id":"c","choices":[],"usage":{"prompt_tokens":5,"completion_tokens":7,'
    b'"total_tokens":12,"prompt_tokens_details":{"cached_tokens":0}}}\n\n'
)
DONE = b"data: [DONE]\n\n"
STREAM = CONTENT + FINISH + USAGE + DONE
WITHOUT = CONTENT + FINISH + DONE


def joined(body: list[bytes | bytearray | memoryview] | None) -> bytes:
    assert body is not None
    return b"".join(bytes(b) for b in body)


def run(parts: list[bytes], batch: int = 1) -> tuple[bytes, UsageChunkFilter, int]:
    """The client's bytes for ``parts`` (each one read), ``batch`` reads per batch, and the
    usage the scanner read from the same views."""
    f = UsageChunkFilter()
    scanner = UsageScanner()
    views = [memoryview(p) for p in parts if p]
    out: list[memoryview] = []
    for i in range(0, len(views), batch):
        group = views[i : i + batch]
        for v in group:
            scanner.feed(v)
        got = f.feed(group)
        assert all(isinstance(v, memoryview) and len(v) for v in got)
        out += got
    out += f.flush()
    assert scanner.tokens is not None
    return b"".join(bytes(v) for v in out), f, scanner.tokens


# -- the request body -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("body", "options"),
    [
        (b'{"model":"g","stream":true,"messages":[]}', {"include_usage": True}),
        (b' {\n "stream" : true }', {"include_usage": True}),
        (b'{"stream":true,"stream_options":null}', {"include_usage": True}),
        (b'{"stream":true,"stream_options":{}}', {"include_usage": True}),
        (
            b'{"stream":true,"stream_options":{"include_usage":false,"x":[1, 2.50]}}',
            {"include_usage": True, "x": [1, 2.5]},
        ),
        (
            b'{"stream_options":{"continuous_usage_stats":true},"stream":true}',
            {"continuous_usage_stats": True, "include_usage": True},
        ),
        (b'{"stream":false,"stream":true}', {"include_usage": True}),
        # Strings that end in an escaped backslash, or hold escaped quotes and keys.
        (
            b'{"p":"a\\\\","stream":true,"q":"\\",\\"stream_options\\":1","stream_options":null}',
            {"include_usage": True},
        ),
    ],
)
def test_a_stream_that_did_not_ask_is_sent_asking_for_its_usage(
    body: bytes, options: dict[str, object]
) -> None:
    before = metrics.copied_bytes("relay_stream_options")
    out = rewrite_body(memoryview(body), model=None, ask_usage=True)
    assert out.asked_usage
    sent = json.loads(joined(out.body))
    assert sent["stream_options"] == options
    assert {k: v for k, v in sent.items() if k != "stream_options"} == {
        k: v for k, v in json.loads(body).items() if k != "stream_options"
    }
    # The client's own stream_options object is the only copy; an added one is none.
    had = json.loads(body).get("stream_options")
    copied = metrics.copied_bytes("relay_stream_options") - before
    assert (copied > 0) == bool(had is not None)
    # Every other byte of the body is a view of the client's buffer.
    assert sum(len(b) for b in out.body or () if isinstance(b, memoryview)) >= len(body) - 64


def test_the_model_and_the_usage_are_rewritten_in_one_body() -> None:
    body = b'{"model":"g","prompt":"x","stream":true,"stream_options":{"include_usage":null}}'
    out = rewrite_body(memoryview(body), model="echo", ask_usage=True)
    sent = json.loads(joined(out.body))
    assert out.asked_usage and sent["model"] == "echo"
    assert sent["stream_options"] == {"include_usage": True} and sent["prompt"] == "x"
    # Not counting: only the model changes, nothing is asked.
    out = rewrite_body(memoryview(body), model="echo", ask_usage=False)
    assert not out.asked_usage and json.loads(joined(out.body))["stream_options"] == {
        "include_usage": None
    }


@pytest.mark.parametrize(
    "body",
    [
        b'{"stream":true,"stream_options":{"include_usage":true}}',  # asked already
        b'{"stream":false}',
        b'{"stream":"true"}',
        b'{"messages":[{"stream":true}]}',  # not a top-level key
        b'{"stream":true,"stream_options":"yes"}',  # the upstream's 400 to give
        b'{"stream":true,"stream_options":{"include_usage":1}}',
        b'{"stream":true,',  # not JSON: sent as it came
        b"[1]",
    ],
)
def test_other_bodies_are_sent_as_they_came(body: bytes) -> None:
    out = rewrite_body(memoryview(body), model=None, ask_usage=True)
    assert out.body is None and not out.asked_usage


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=6),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3)
    ),
    max_leaves=10,
)
stream_values = st.sampled_from([True, False, None, "true", 1])
options_values = st.one_of(
    st.none(),
    st.dictionaries(st.text(max_size=6), json_values, max_size=3),
    st.sampled_from(["x", 3, [True]]),
)
flags = st.sampled_from([True, False, None, 1, "yes"])
MISSING = object()


@settings(max_examples=300, deadline=None)
@given(
    st.dictionaries(st.text(max_size=8), json_values, max_size=4),
    st.one_of(st.just(MISSING), stream_values),
    st.one_of(st.just(MISSING), options_values),
    st.one_of(st.just(MISSING), flags),
)
def test_the_rewrite_asks_exactly_when_a_stream_did_not(
    obj: dict[str, object], stream: object, options: object, flag: object
) -> None:
    obj = {k: v for k, v in obj.items() if k not in ("stream", "stream_options")}
    if stream is not MISSING:
        obj["stream"] = stream
    if options is not MISSING:
        if isinstance(options, dict) and flag is not MISSING:
            options = {**options, "include_usage": flag}
        obj["stream_options"] = options
    body = msgspec.json.encode(obj)
    out = rewrite_body(memoryview(body), model=None, ask_usage=True)
    opts = obj.get("stream_options")
    asked = opts.get("include_usage") if isinstance(opts, dict) else None
    should = (
        obj.get("stream") is True
        and (opts is None or isinstance(opts, dict))
        and asked in (None, False)
        and not (isinstance(asked, int) and not isinstance(asked, bool))
    )
    assert out.asked_usage == should and (out.body is not None) == should
    if should:
        sent = msgspec.json.decode(joined(out.body))
        want = {**(opts if isinstance(opts, dict) else {}), "include_usage": True}
        assert sent == {**obj, "stream_options": want}


# -- the stream -------------------------------------------------------------------------


def test_whole_events_in_whole_reads_lose_only_the_usage_chunk_without_a_copy() -> None:
    before = metrics.copied_bytes()
    for batch in (1, 2, 4):
        got, f, tokens = run([CONTENT, FINISH, USAGE, DONE], batch)
        assert got == WITHOUT and f.dropped == 1 and tokens == 12
        got, f, tokens = run([STREAM], batch)
        assert got == WITHOUT and f.dropped == 1 and tokens == 12
    assert metrics.copied_bytes() == before


def test_the_usage_chunk_is_dropped_however_the_reads_cut_the_stream() -> None:
    crlf = (STREAM.replace(b"\n", b"\r\n"), WITHOUT.replace(b"\n", b"\r\n"))
    for stream, without in ((STREAM, WITHOUT), crlf):
        n = len(stream)
        for cut in range(n + 1):
            for second in range(cut, min(n, cut + 40) + 1):
                parts = [stream[:cut], stream[cut:second], stream[second:]]
                for batch in (1, 3):
                    got, f, tokens = run(parts, batch)
                    assert got == without, (cut, second, batch)
                    assert f.dropped == 1 and tokens == 12


def test_a_stream_read_byte_by_byte_copies_each_event_once() -> None:
    before = metrics.copied_bytes("relay_events")
    got, f, _ = run([STREAM[i : i + 1] for i in range(len(STREAM))])
    assert got == WITHOUT and f.dropped == 1
    assert metrics.copied_bytes("relay_events") - before == len(STREAM)


@pytest.mark.parametrize(
    "stream",
    [
        # A cumulative usage on every chunk, with its choices: the client gets it all.
        CONTENT.replace(b'"usage":null', b'"usage":{"total_tokens":3}') + DONE,
        # Empty choices without a usage (Azure's first chunk).
        b'data: {"choices":[],"prompt_filter_results":[]}\n\n' + CONTENT + DONE,
        # A named event, or a usage that is not an object.
        b"event: x\n" + USAGE + DONE,
        b'data: {"choices":[],"usage":[1]}\n\n' + DONE,
        # Not JSON after all, and an event the stream never ended.
        b'data: {"choices":[],"usage":{"total_tokens":1}\n\n' + DONE,
        CONTENT + USAGE[:-2],
    ],
)
def test_events_that_are_not_a_usage_chunk_pass_as_they_came(stream: bytes) -> None:
    for cut in range(len(stream) + 1):
        f = UsageChunkFilter()
        views = [memoryview(stream[:cut]), memoryview(stream[cut:])]
        got = f.feed([v for v in views if len(v)]) + f.flush()
        assert b"".join(bytes(v) for v in got) == stream, cut
        assert f.dropped == 0


def test_a_usage_chunk_past_the_bound_is_not_judged() -> None:
    pad = b"x" * USAGE_EVENT_MAX_BYTES
    big = USAGE.replace(b'"id":"c"', b'"id":"' + pad + b'"')
    assert is_usage_chunk(big) and len(big) > USAGE_EVENT_MAX_BYTES
    stream = CONTENT + big + DONE
    for parts in ([stream], [stream[:100], stream[100:5000], stream[5000:]]):
        f = UsageChunkFilter()
        got = f.feed([memoryview(p) for p in parts]) + f.flush()
        assert b"".join(bytes(v) for v in got) == stream and f.dropped == 0
    # The held part of a long event goes out once it passes the bound, unjudged.
    f = UsageChunkFilter()
    held = f.feed([memoryview(CONTENT + big[:100])])
    assert b"".join(bytes(v) for v in held) == CONTENT
    passed = f.feed([memoryview(big[100:])])
    assert b"".join(bytes(v) for v in passed) == big


def test_the_chunk_json_is_what_decides() -> None:
    assert is_usage_chunk(USAGE) and is_usage_chunk(USAGE.replace(b"\n", b"\r\n"))
    assert is_usage_chunk(b'data:{"choices":[ ],"usage":{}}\n\n')
    two_lines = b'data: {"choices":[],\ndata: "usage":{"total_tokens":2}}\n\n'
    assert is_usage_chunk(two_lines)
    assert msgspec.json.decode(b'{"choices":[],\n"usage":{"total_tokens":2}}')
    assert not is_usage_chunk(b'data: {"choices":[],"usage":null,"x":{"usage":{}}}\n\n')
    assert not is_usage_chunk(DONE) and not is_usage_chunk(CONTENT)
