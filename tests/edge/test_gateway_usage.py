"""A relayed request's model and tokens in the gateway's access log and key quota, read
from a real upstream's own ``usage`` (a zeroserve server behind the gateway), for
answers and streams; a stream that did not ask for its usage asks for it through the
gateway and never sees the usage chunk (a zeroserve upstream, and one that writes in
pieces); a stream is debited as its chunks pass, then by its usage; and the usage
scanner on reads cut anywhere."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import anthropic
import httpx
import openai
import pytest
from openai.types.chat import ChatCompletionChunk

from tests.edge.servers import LogSink, ManualClock
from tests.support import ServerThread, scaled
from zeroserve import metrics
from zeroserve.app.relay._usage import UsageScanner
from zeroserve.edge import AccessLog, Edge, EdgeOptions
from zeroserve.edge.keys import ApiKey, KeyLimits
from zeroserve.models.echo import EchoModel
from zeroserve.models.loader import parse_spec
from zeroserve.runtime import ModelConfig

KEY = "sk-gateway-user-0123456789"


@pytest.fixture(scope="module")
def upstream() -> Iterator[ServerThread]:
    server = ServerThread({"echo": ModelConfig("echo", EchoModel)}, edge=Edge()).start()
    yield server
    server.stop()


def gateway(upstream: ServerThread, edge: Edge) -> ServerThread:
    spec = parse_spec(f"g=remote:{upstream.url}/v1?upstream_model=echo")
    configs = {"g": ModelConfig("g", spec.load_class(), options=spec.options, **spec.runtime)}
    return ServerThread(configs, edge=edge).start()


@pytest.fixture
def logged(upstream: ServerThread) -> Iterator[tuple[ServerThread, LogSink]]:
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
    logged: tuple[ServerThread, LogSink],
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
    logged: tuple[ServerThread, LogSink],
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


def test_relayed_tokens_count_against_the_keys_tokens_per_minute(
    upstream: ServerThread,
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


# -- streams that did not ask for their usage ---------------------------------------------
def dump(chunks: list[Any]) -> list[dict[str, Any]]:
    """The chunks as the SDK read them, without what differs between two requests."""
    return [c.model_dump(exclude={"id", "created"}) for c in chunks]


def stream(
    client: openai.OpenAI, kind: str, model: str, max_tokens: int = 6, **kw: Any
) -> list[Any]:
    if kind == "chat":
        return list(
            client.chat.completions.create(
                model=model,
                messages=[{"role": "user", "content": "one two three four"}],
                max_tokens=max_tokens,
                stream=True,
                **kw,
            )
        )
    return list(
        client.completions.create(
            model=model, prompt="a b c d e", max_tokens=max_tokens, stream=True, **kw
        )
    )


@pytest.mark.parametrize("kind", ["chat", "completion"])
def test_a_stream_that_did_not_ask_is_counted_and_gets_no_usage_chunk(
    upstream: ServerThread, logged: tuple[ServerThread, LogSink], kind: str
) -> None:
    server, sink = logged
    direct = stream(upstream.client(), kind, "echo")
    asked = stream(upstream.client(), kind, "echo", stream_options={"include_usage": True})
    usage = asked[-1].usage
    assert usage is not None and asked[-1].choices == []
    relayed = stream(server.client(), kind, "g", extra_headers={"x-request-id": f"hide-{kind}"})
    # The upstream's chunks, but its usage chunk: none the client did not ask for.
    assert dump(relayed) == dump(direct) and len(relayed) == len(asked) - 1
    assert all(c.choices and c.usage is None for c in relayed)
    rec = record(sink, f"hide-{kind}")
    assert rec["model"] == "g" and rec["status"] == 200 and rec["outcome"] == "done"
    assert rec["tokens"] == usage.total_tokens


def test_a_stream_that_asked_gets_its_usage_chunk_as_before(
    upstream: ServerThread, logged: tuple[ServerThread, LogSink]
) -> None:
    server, sink = logged
    options = {"stream_options": {"include_usage": True}}
    direct = stream(upstream.client(), "chat", "echo", **options)
    relayed = stream(server.client(), "chat", "g", extra_headers={"x-request-id": "ask"}, **options)
    assert dump(relayed) == dump(direct)
    last = relayed[-1]
    assert last.choices == [] and last.usage is not None
    assert record(sink, "ask")["tokens"] == last.usage.total_tokens


def test_a_stream_that_did_not_ask_spends_the_keys_tokens_per_minute(
    upstream: ServerThread,
) -> None:
    clock = ManualClock()
    # 15 tokens a minute refill one every 4 s (exactly: no rounding in the wait).
    key = ApiKey("user", KEY.encode(), KeyLimits(tokens_per_minute=15))
    server = gateway(upstream, Edge(EdgeOptions(keys=(key,)), clock=clock))
    try:
        options = {"include_usage": True}
        asked = stream(upstream.client(), "chat", "echo", 16, stream_options=options)
        assert asked[-1].usage is not None
        spent = asked[-1].usage.total_tokens
        assert spent > 15
        client = server.client(KEY)
        relayed = stream(client, "chat", "g", 16)
        assert all(c.choices for c in relayed)
        assert server.edge.statistics()["user"].tokens == spent
        with pytest.raises(openai.RateLimitError) as info:
            stream(client, "completion", "g")
        # In debt by spent - 15, and 1 more to admit: (spent - 14) tokens at 4 s each.
        h = info.value.response.headers
        assert h["retry-after"] == str(4 * (spent - 14))
        assert h["retry-after-ms"] == str(4000 * (spent - 14))
        assert h["x-ratelimit-remaining-tokens"] == "0"
        clock.now += 4 * (spent - 14)
        assert all(c.choices for c in stream(client, "completion", "g"))
    finally:
        server.stop()


# An OpenAI-style upstream that writes a stream in pieces: the usage chunk only when the
# request asked for it, cut inside ``"choices": []``, its second half written only once
# the test has read the chunks before it through the gateway (a read of its own).
GATE_TIMEOUT_S = scaled(30.0)


class PacedUpstream:
    def __init__(self) -> None:
        self.bodies: list[bytes] = []
        self.gate = threading.Event()  # the second half of the usage chunk may go
        self.end_gate = threading.Event()  # the end of the body may go (after [DONE])
        self.end_gate.set()
        self.usage = {"prompt_tokens": 11, "completion_tokens": 3, "total_tokens": 14}
        self.chunked = True  # else the body ends when the connection closes
        paced = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:
                pass

            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["content-length"]))
                paced.bodies.append(body)
                paced.answer(self, json.loads(body))

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.httpd.server_address[1]}"

    def events(self, asked: bool) -> tuple[list[bytes], bytes | None]:
        base = {"id": "c1", "object": "chat.completion.chunk", "created": 1, "model": "m"}
        extra = {"usage": None} if asked else {}
        deltas = [{"role": "assistant", "content": ""}, {"content": "hi"}, {"content": " there"}]
        chunks = [
            {**base, "choices": [{"index": 0, "delta": d, "finish_reason": None}], **extra}
            for d in deltas
        ]
        chunks.append(
            {**base, "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}], **extra}
        )
        usage = {**base, "choices": [], "usage": self.usage}
        sse = [b"data: " + json.dumps(c).encode() + b"\n\n" for c in chunks]
        return sse, (b"data: " + json.dumps(usage).encode() + b"\n\n") if asked else None

    def answer(self, handler: BaseHTTPRequestHandler, body: dict[str, Any]) -> None:
        asked = bool((body.get("stream_options") or {}).get("include_usage"))
        sse, usage = self.events(asked)
        w = handler.wfile
        framing = b"transfer-encoding: chunked" if self.chunked else b"connection: close"
        w.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n%s\r\n\r\n" % framing)

        def chunk(data: bytes) -> None:
            w.write(b"%x\r\n%s\r\n" % (len(data), data) if self.chunked else data)
            w.flush()

        if usage is None:
            chunk(b"".join(sse))
        else:
            cut = usage.index(b'"choices"') + 5
            chunk(b"".join(sse) + usage[:cut])
            self.gate.wait(GATE_TIMEOUT_S)
            chunk(usage[cut:])
        chunk(b"data: [DONE]\n\n")
        self.end_gate.wait(GATE_TIMEOUT_S)
        if self.chunked:
            w.write(b"0\r\n\r\n")
            w.flush()
        else:
            handler.close_connection = True

    def stop(self) -> None:
        self.gate.set()
        self.end_gate.set()
        self.httpd.shutdown()
        self.httpd.server_close()
        self.thread.join(GATE_TIMEOUT_S)


@pytest.fixture
def paced() -> Iterator[PacedUpstream]:
    up = PacedUpstream()
    yield up
    up.stop()


def paced_gateway(up: PacedUpstream, edge: Edge) -> ServerThread:
    spec = parse_spec(f"f=remote:{up.url}/v1")
    configs = {"f": ModelConfig("f", spec.load_class(), options=spec.options, **spec.runtime)}
    return ServerThread(configs, edge=edge).start()


def test_a_usage_chunk_cut_across_reads_is_still_counted_and_dropped(
    paced: PacedUpstream,
) -> None:
    sink = LogSink()
    server = paced_gateway(paced, Edge(access_log=AccessLog(stream=sink)))
    try:
        before = metrics.copied_bytes("relay_events")
        got = []
        for c in server.client().chat.completions.create(
            model="f",
            messages=[{"role": "user", "content": "hello"}],
            stream=True,
            extra_headers={"x-request-id": "paced"},
        ):
            got.append(c)
            if c.choices[0].finish_reason is not None:
                paced.gate.set()  # only now the rest of the usage chunk is written
        sent = json.loads(paced.bodies[-1])
        assert sent["stream_options"] == {"include_usage": True}
        sse, _ = paced.events(asked=True)
        expected = [ChatCompletionChunk.model_validate_json(e[len(b"data: ") :]) for e in sse]
        assert [c.model_dump() for c in got] == [e.model_dump() for e in expected]
        assert record(sink, "paced")["tokens"] == paced.usage["total_tokens"]
        # Its first part was held back as a view, then joined once whole (a copy).
        assert metrics.copied_bytes("relay_events") > before
    finally:
        server.stop()


def test_a_stream_is_debited_as_its_chunks_pass_then_by_its_usage(
    paced: PacedUpstream,
) -> None:
    clock = ManualClock()
    key = ApiKey("user", KEY.encode(), KeyLimits(tokens_per_minute=600))
    server = paced_gateway(paced, Edge(EdgeOptions(keys=(key,)), clock=clock))
    try:
        spent = []
        for c in server.client(KEY).chat.completions.create(
            model="f", messages=[{"role": "user", "content": "hello"}], stream=True
        ):
            spent.append(server.edge.statistics()["user"].tokens)
            if c.choices[0].finish_reason is not None:
                paced.gate.set()  # the usage chunk only now
        # One token a content delta ("hi", " there") once they passed, before the usage
        # (held back by the upstream until the client had the last chunk).
        assert spent[-1] == 2 and len(spent) == 4
        assert server.edge.statistics()["user"].tokens == paced.usage["total_tokens"]
    finally:
        server.stop()


def test_only_a_counting_edge_changes_the_body(paced: PacedUpstream) -> None:
    body = b'{"model":"f","stream":true,"messages":[{"role":"user","content":"x"}]}'
    headers = {"content-type": "application/json"}
    paced.gate.set()
    plain = paced_gateway(paced, Edge())
    try:
        r = httpx.post(plain.url + "/v1/chat/completions", content=body, headers=headers)
        assert r.status_code == 200 and b'"choices": []' not in r.content
        assert paced.bodies[-1] == body  # no keys, no log: the client's bytes, as they came
    finally:
        plain.stop()
    counting = paced_gateway(paced, Edge(access_log=AccessLog(stream=LogSink())))
    try:
        r = httpx.post(counting.url + "/v1/chat/completions", content=body, headers=headers)
        assert r.status_code == 200 and b'"choices": []' not in r.content
        assert b'"usage": {' not in r.content and r.content.endswith(b"data: [DONE]\n\n")
        sent = json.loads(paced.bodies[-1])
        assert sent.pop("stream_options") == {"include_usage": True}
        assert sent == json.loads(body)
    finally:
        counting.stop()


def test_a_client_that_leaves_at_done_has_spent_its_tokens(paced: PacedUpstream) -> None:
    # The upstream holds its body's end back: the client has [DONE] and goes (as the
    # openai SDK does) while the relayed stream is still open.
    paced.gate.set()
    paced.end_gate.clear()
    clock = ManualClock()
    sink = LogSink()
    key = ApiKey("user", KEY.encode(), KeyLimits(tokens_per_minute=600))
    edge = Edge(EdgeOptions(keys=(key,)), access_log=AccessLog(stream=sink), clock=clock)
    server = paced_gateway(paced, edge)
    try:
        with httpx.stream(
            "POST",
            server.url + "/v1/chat/completions",
            json={"model": "f", "stream": True, "messages": [{"role": "user", "content": "x"}]},
            headers={"authorization": f"Bearer {KEY}", "x-request-id": "leaves"},
        ) as r:
            seen = b""
            for part in r.iter_bytes():
                seen += part
                if seen.endswith(b"data: [DONE]\n\n"):
                    break
        assert b'"choices": []' not in seen
        rec = record(sink, "leaves")
        assert rec["outcome"] == "client_gone"
        assert rec["tokens"] == paced.usage["total_tokens"]
        assert server.edge.statistics()["user"].tokens == paced.usage["total_tokens"]
    finally:
        paced.end_gate.set()
        server.stop()


def test_a_stream_read_to_its_close_loses_its_usage_chunk_too(paced: PacedUpstream) -> None:
    # Without a length or chunks the relay reads the body to its end, then answers.
    paced.chunked = False
    paced.gate.set()
    sink = LogSink()
    server = paced_gateway(paced, Edge(access_log=AccessLog(stream=sink)))
    try:
        got = list(
            server.client().completions.create(
                model="f", prompt="x", stream=True, extra_headers={"x-request-id": "closed"}
            )
        )
        assert len(got) == len(paced.events(asked=True)[0])
        assert all(c.choices for c in got)
        assert record(sink, "closed")["tokens"] == paced.usage["total_tokens"]
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


# -- Anthropic's Messages API, relayed ----------------------------------------------------
def test_a_relayed_message_counts_its_input_and_output_against_the_key(
    upstream: ServerThread,
) -> None:
    clock = ManualClock()
    key = ApiKey("user", KEY.encode(), KeyLimits(tokens_per_minute=10_000))
    server = gateway(upstream, Edge(EdgeOptions(keys=(key,)), clock=clock))
    try:
        client = anthropic.Anthropic(base_url=server.url, api_key=KEY, max_retries=0)
        with client:
            _count_messages(client, server)
    finally:
        server.stop()


def _count_messages(client: anthropic.Anthropic, server: ServerThread) -> None:
    """A whole message and a stream, each debited by its input and output tokens."""
    whole = client.messages.create(
        model="g", max_tokens=5, messages=[{"role": "user", "content": "a b c d e f"}]
    )
    spent = whole.usage.input_tokens + whole.usage.output_tokens
    assert whole.usage.input_tokens > 0 and whole.usage.output_tokens > 0
    assert server.edge.statistics()["user"].tokens == spent
    with client.messages.stream(
        model="g", max_tokens=7, messages=[{"role": "user", "content": "g h i"}]
    ) as stream:
        final = stream.get_final_message()
    assert final.usage.output_tokens > 0
    spent += final.usage.input_tokens + final.usage.output_tokens
    assert server.edge.statistics()["user"].tokens == spent


def test_an_anthropic_stream_counts_its_input_once_and_its_output_as_it_grows() -> None:
    scanner = UsageScanner()
    scanner.feed(
        b'event: message_start\ndata: {"type":"message_start","message":{"usage":'
        b'{"input_tokens":9,"output_tokens":1}}}\n\n'
    )
    assert scanner.tokens == 10
    # Anthropic's message_delta may carry the cumulative output alone.
    scanner.feed(
        b'event: message_delta\ndata: {"type":"message_delta","delta":{},"usage":'
        b'{"output_tokens":6}}\n\n'
    )
    assert scanner.tokens == 15
    scanner.feed(
        b'data: {"usage":{"input_tokens":4,"cache_read_input_tokens":5,"output_tokens":6}}'
    )
    assert scanner.tokens == 15
