"""A relayed request's model and tokens in the gateway's access log and key quota, read
from a real upstream's own ``usage`` (a zeroserve server behind the gateway), for
answers and streams; and the usage scanner on reads cut anywhere."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest
from tests.edge.servers import EdgeServer, LogSink, ManualClock

import openai
from zeroserve.app.relay._usage import UsageScanner
from zeroserve.edge import AccessLog, Edge, EdgeOptions
from zeroserve.edge.keys import ApiKey, KeyLimits
from zeroserve.models.echo import EchoModel
from zeroserve.models.loader import parse_spec
from zeroserve.runtime import ModelConfig

KEY = "sk-gateway-user-0123456789"


@pytest.fixture(scope="module")
def upstream() -> Iterator[EdgeServer]:
    server = EdgeServer({"echo": ModelConfig("echo", EchoModel)}, Edge()).start()
    yield server
    server.stop()


def gateway(upstream: EdgeServer, edge: Edge) -> EdgeServer:
    spec = parse_spec(f"g=remote:{upstream.url}/v1?upstream_model=echo")
    configs = {"g": ModelConfig("g", spec.load_class(), options=spec.options, **spec.runtime)}
    return EdgeServer(configs, edge).start()


@pytest.fixture
def logged(upstream: EdgeServer) -> Iterator[tuple[EdgeServer, LogSink]]:
    sink = LogSink()
    server = gateway(upstream, Edge(access_log=AccessLog(stream=sink)))
    yield server, sink
    server.stop()


def record(sink: LogSink, request_id: str) -> dict[str, object]:
    text = sink.wait_for_text(f'"{request_id}"'.encode())
    found: dict[str, object] = next(
        json.loads(x) for x in text.splitlines() if f'"{request_id}"'.encode() in x
    )
    return found


def test_a_relayed_answer_logs_its_model_and_the_upstreams_tokens(
    logged: tuple[EdgeServer, LogSink],
) -> None:
    server, sink = logged
    r = server.client().chat.completions.create(
        model="g",
        messages=[{"role": "user", "content": "one two three"}],
        max_tokens=4,
        extra_headers={"x-request-id": "relay-answer"},
    )
    assert r.usage is not None and r.usage.total_tokens > 0
    rec = record(sink, "relay-answer")
    assert rec["model"] == "g" and rec["status"] == 200 and rec["outcome"] == "done"
    assert rec["tokens"] == r.usage.total_tokens


def test_a_relayed_stream_logs_the_usage_its_last_chunk_reports(
    logged: tuple[EdgeServer, LogSink],
) -> None:
    server, sink = logged
    chunks = list(
        server.client().completions.create(
            model="g",
            prompt="a b c d",
            max_tokens=9,
            stream=True,
            stream_options={"include_usage": True},
            extra_headers={"x-request-id": "relay-stream"},
        )
    )
    usage = chunks[-1].usage
    assert usage is not None and usage.total_tokens == usage.prompt_tokens + 9
    rec = record(sink, "relay-stream")
    assert rec["model"] == "g" and rec["tokens"] == usage.total_tokens
    assert isinstance(rec["ttft_s"], float)


def test_a_relayed_stream_without_usage_logs_no_tokens(
    logged: tuple[EdgeServer, LogSink],
) -> None:
    server, sink = logged
    chunks = list(
        server.client().completions.create(
            model="g",
            prompt="a b",
            max_tokens=3,
            stream=True,
            extra_headers={"x-request-id": "relay-no-usage"},
        )
    )
    assert chunks and all(c.usage is None for c in chunks)
    rec = record(sink, "relay-no-usage")
    assert rec["model"] == "g" and rec["status"] == 200 and "tokens" not in rec


def test_relayed_tokens_count_against_the_keys_tokens_per_minute(
    upstream: EdgeServer,
) -> None:
    clock = ManualClock()
    key = ApiKey("user", KEY.encode(), KeyLimits(tokens_per_minute=10))
    server = gateway(upstream, Edge(EdgeOptions(keys=(key,)), clock=clock))
    try:
        client = server.client(KEY)
        # The upstream reports more than 10 tokens: the key's bucket goes into debt.
        r = client.completions.create(model="g", prompt="a b c d e f", max_tokens=8)
        assert r.usage is not None and r.usage.total_tokens > 10
        with pytest.raises(openai.RateLimitError) as info:
            client.completions.create(model="g", prompt="a", max_tokens=1)
        assert int(info.value.response.headers["retry-after"]) > 0
        assert server.edge.statistics()["user"].tokens == r.usage.total_tokens
    finally:
        server.stop()


# -- the scanner, on reads cut anywhere -----------------------------------------------------
STREAM = (
    b'data: {"choices":[{"delta":{"content":"say \\"usage\\": {1}"}}],"usage":null}\n\n'
    b'data: {"choices":[],"usage":{"prompt_tokens":5,"completion_tokens":7,'
    b'"total_tokens":12,"prompt_tokens_details":{"cached_tokens":0}}}\n\n'
    b"data: [DONE]\n\n"
)


def test_the_usage_is_found_however_the_reads_cut_the_bytes() -> None:
    for cut in range(len(STREAM) + 1):
        for second in range(cut, min(len(STREAM), cut + 24) + 1):
            scanner = UsageScanner()
            for part in (STREAM[:cut], STREAM[cut:second], STREAM[second:]):
                scanner.feed(memoryview(part))
            assert scanner.tokens == 12, (cut, second)


def test_no_usage_or_an_unreadable_one_counts_nothing() -> None:
    for body in (
        b'{"usage":null}',
        b'{"content":"\\"usage\\": {\\"total_tokens\\": 3}"}',
        b'{"usage":{"total_tokens":"many"}}',
        b"\x00\xff" * 100,
    ):
        scanner = UsageScanner()
        scanner.feed(body)
        assert scanner.tokens is None, body
    scanner = UsageScanner()
    scanner.feed(b'{"usage":{"prompt_tokens":3,"completion_tokens":4}}')
    assert scanner.tokens == 7
