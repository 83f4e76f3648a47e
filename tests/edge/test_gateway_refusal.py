"""A relayed stream to an upstream that refuses ``stream_options``: a strict
OpenAI-compatible server (a real HTTP server on 127.0.0.1) that answers any request
naming it with a 400 (or 422) in OpenAI's error format, and streams SSE chunks without a
usage otherwise. Through a counting gateway the client still gets its stream (the
request is sent once more without the option the gateway added, and later ones without
it from the start), its tokens are still counted (one per content delta) against the
key's quota and in the access log, and a client that sent ``stream_options`` itself gets
the upstream's 400 as it came."""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.edge.servers import LogSink, ManualClock
from tests.support import ServerThread, scaled
from zeroserve.edge import AccessLog, Edge, EdgeOptions
from zeroserve.edge.keys import ApiKey, KeyLimits
from zeroserve.models.loader import parse_spec
from zeroserve.runtime import ModelConfig

KEY = "sk-strict-user-0123456789"
# The strict upstream's completion, one content delta a chunk (the second holds a quoted
# '"content": "x"', escaped in its JSON string: still one delta).
DELTAS = ["Hel", ' said "content": "x"', ",", " wor", "ld", "!"]
USAGE = {"prompt_tokens": 4, "completion_tokens": 7, "total_tokens": 11}
WAIT_S = scaled(30.0)  # the longest a test polls for the gateway to settle


class StrictUpstream:
    """An OpenAI-compatible server that does not accept ``stream_options``: a body that
    has it gets ``status`` with an OpenAI error (naming the field unless ``generic``);
    any other streams ``DELTAS``. ``bad``: every request gets the 400 (a bad prompt)."""

    def __init__(self, status: int = 400, *, generic: bool = False) -> None:
        self.status = status
        self.generic = generic
        self.bad = False
        self.accepts = False  # take stream_options after all (and report the usage)
        self.reports = True  # with accepts: send the usage asked for (else ignore it)
        self.overloaded = False  # a request without stream_options gets a 503
        self.bodies: list[dict[str, Any]] = []
        self.raw: list[bytes] = []  # the bodies as they came
        self.lock = threading.Lock()
        strict = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:
                pass

            def do_POST(self) -> None:
                raw = self.rfile.read(int(self.headers["content-length"]))
                body = json.loads(raw)
                with strict.lock:
                    strict.bodies.append(body)
                    strict.raw.append(raw)
                strict.answer(self, body)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.httpd.server_address[1]}"

    def sent(self) -> list[dict[str, Any]]:
        with self.lock:
            return list(self.bodies)

    def error(self, body: dict[str, Any]) -> bytes:
        if self.generic:
            message, param = "extra fields not permitted", None
        elif "stream_options" in body and self.accepts:
            message, param = "stream_options: only include_usage is known", "stream_options"
        elif "stream_options" in body:
            message = "Unrecognized request argument supplied: stream_options"
            param = "stream_options"
        else:
            message, param = "the prompt is not acceptable", "messages"
        error = {"message": message, "type": "invalid_request_error", "param": param}
        return json.dumps({"error": {**error, "code": None}}).encode()

    def answer(self, handler: BaseHTTPRequestHandler, body: dict[str, Any]) -> None:
        w = handler.wfile
        if self.overloaded and "stream_options" not in body:
            data = b'{"error": {"message": "overloaded", "type": "server_error"}}'
            w.write(
                b"HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\n"
                b"content-length: %d\r\n\r\n%s" % (len(data), data)
            )
            w.flush()
            return
        options = body.get("stream_options")
        foreign = isinstance(options, dict) and set(options) - {"include_usage"}
        if self.bad or ("stream_options" in body and not self.accepts) or foreign:
            data = self.error(body)
            w.write(
                b"HTTP/1.1 %d Bad Request\r\ncontent-type: application/json\r\n"
                b"content-length: %d\r\n\r\n%s" % (self.status, len(data), data)
            )
            w.flush()
            return
        w.write(
            b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
            b"transfer-encoding: chunked\r\n\r\n"
        )
        asked = bool((body.get("stream_options") or {}).get("include_usage"))
        usage = asked and self.reports
        for event in self.events(chat="messages" in body, usage=usage):
            w.write(b"%x\r\n%s\r\n" % (len(event), event))
            w.flush()  # one write a chunk, as a server that streams tokens does
        w.write(b"0\r\n\r\n")
        w.flush()

    @staticmethod
    def events(*, chat: bool, usage: bool = False) -> list[bytes]:
        base = {"id": "s1", "created": 1, "model": "strict"}
        if chat:
            base["object"] = "chat.completion.chunk"
            first = {"index": 0, "delta": {"role": "assistant", "content": ""}}
            choices = [first] + [{"index": 0, "delta": {"content": d}} for d in DELTAS]
            last = {"index": 0, "delta": {}, "finish_reason": "stop"}
        else:
            base["object"] = "text_completion"
            choices = [{"index": 0, "text": d} for d in DELTAS]
            last = {"index": 0, "text": "", "finish_reason": "stop"}
        chunks = [{**base, "choices": [c]} for c in [*choices, last]]
        if usage:
            chunks.append({**base, "choices": [], "usage": USAGE})
        return [b"data: %s\n\n" % json.dumps(c).encode() for c in chunks] + [b"data: [DONE]\n\n"]

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
        self.thread.join(WAIT_S)


@pytest.fixture
def strict() -> Iterator[StrictUpstream]:
    up = StrictUpstream()
    yield up
    up.stop()


def gateway(
    up: StrictUpstream, edge: Edge, name: str, query: str = "", *more: StrictUpstream
) -> ServerThread:
    urls = ",".join(f"{u.url}/v1" for u in (up, *more))
    spec = parse_spec(f"{name}=remote:{urls}{query}")
    configs = {name: ModelConfig(name, spec.load_class(), options=spec.options, **spec.runtime)}
    return ServerThread(configs, edge=edge).start()


def chat(client: openai.OpenAI, model: str, **kw: Any) -> list[Any]:
    return list(
        client.chat.completions.create(
            model=model, messages=[{"role": "user", "content": "hello"}], stream=True, **kw
        )
    )


def content(chunks: list[Any]) -> str:
    return "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)


def scrape(server: ServerThread) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    text = httpx.get(server.url + "/metrics").text
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def counter(server: ServerThread, name: str, model: str) -> float:
    return scrape(server).get((name, (("model", model),)), 0.0)


def assert_no_leases(server: ServerThread) -> None:
    """The gateway's arena holds no lease once its responses are sent (polled)."""
    deadline = time.monotonic() + WAIT_S
    while (leases := scrape(server)[("zeroserve_arena_leases", ())]) != 0:
        assert time.monotonic() < deadline, f"{leases} leases still held"


def record(sink: LogSink, request_id: str) -> dict[str, Any]:
    text = sink.wait_for_text(f'"{request_id}"'.encode())
    found: dict[str, Any] = next(
        json.loads(x) for x in text.splitlines() if f'"{request_id}"'.encode() in x
    )
    return found


def test_a_strict_upstream_streams_through_a_counting_gateway(
    strict: StrictUpstream, caplog: pytest.LogCaptureFixture
) -> None:
    sink = LogSink()
    server = gateway(strict, Edge(access_log=AccessLog(stream=sink)), "strict-chat")
    caplog.set_level(logging.WARNING, logger="zeroserve.relay")
    client = server.client()
    try:
        first = chat(client, "strict-chat", extra_headers={"x-request-id": "strict-1"})
        assert content(first) == "".join(DELTAS)
        assert all(c.usage is None for c in first)
        # Asked for its usage, refused, sent once more as the client sent it.
        spliced, plain = strict.sent()
        assert spliced.pop("stream_options") == {"include_usage": True}
        assert spliced == plain and "stream_options" not in plain
        # One token per content delta (the empty first one is none).
        assert record(sink, "strict-1")["tokens"] == len(DELTAS)
        assert record(sink, "strict-1")["status"] == 200
        # The next one goes out without the option from the start.
        second = chat(client, "strict-chat", extra_headers={"x-request-id": "strict-2"})
        assert content(second) == "".join(DELTAS)
        assert len(strict.sent()) == 3 and "stream_options" not in strict.sent()[2]
        assert record(sink, "strict-2")["tokens"] == len(DELTAS)
        name = "zeroserve_relay_stream_options_refused_total"
        assert counter(server, name, "strict-chat") == 1
        name = "zeroserve_relay_usage_estimated_total"
        assert counter(server, name, "strict-chat") == 2
        told = [r for r in caplog.records if "refuses stream_options" in r.getMessage()]
        assert len(told) == 1 and strict.url in told[0].getMessage()
        assert_no_leases(server)
    finally:
        client.close()
        server.stop()


def test_a_completion_stream_is_estimated_too(strict: StrictUpstream) -> None:
    sink = LogSink()
    server = gateway(strict, Edge(access_log=AccessLog(stream=sink)), "strict-text")
    client = server.client()
    try:
        got = list(
            client.completions.create(
                model="strict-text",
                prompt="hello",
                stream=True,
                extra_headers={"x-request-id": "strict-text"},
            )
        )
        assert "".join(c.choices[0].text for c in got) == "".join(DELTAS)
        assert record(sink, "strict-text")["tokens"] == len(DELTAS)
        assert [("stream_options" in b) for b in strict.sent()] == [True, False]
        assert_no_leases(server)
    finally:
        client.close()
        server.stop()


def test_the_resent_body_is_the_clients_bytes_with_only_the_model_rewritten(
    strict: StrictUpstream,
) -> None:
    edge = Edge(access_log=AccessLog(stream=LogSink()))
    server = gateway(strict, edge, "strict-bytes", "?upstream_model=strict")
    try:
        body = b'{ "model" : "strict-bytes", "stream":true, "messages":[{"role":"user","content":"x"}]}'
        r = httpx.post(
            server.url + "/v1/chat/completions",
            content=body,
            headers={"content-type": "application/json"},
        )
        assert r.status_code == 200 and r.content.endswith(b"data: [DONE]\n\n")
        assert r.content == b"".join(strict.events(chat=True))  # the upstream's bytes
        want = body.replace(b'"strict-bytes"', b'"strict"')
        assert strict.raw[0] == b'{"stream_options":{"include_usage":true},' + want[1:]
        assert strict.raw[1] == want
        assert_no_leases(server)
    finally:
        server.stop()


def test_a_key_is_charged_for_a_stream_its_upstream_reports_no_usage_for(
    strict: StrictUpstream,
) -> None:
    clock = ManualClock()
    # Fewer tokens a minute than one stream's deltas: the bucket goes into debt.
    key = ApiKey("user", KEY.encode(), KeyLimits(tokens_per_minute=len(DELTAS) - 1))
    server = gateway(strict, Edge(EdgeOptions(keys=(key,)), clock=clock), "strict-key")
    client = server.client(KEY)
    try:
        assert content(chat(client, "strict-key")) == "".join(DELTAS)
        assert server.edge.statistics()["user"].tokens == len(DELTAS)
        sent = len(strict.sent())
        with pytest.raises(openai.RateLimitError) as info:
            chat(client, "strict-key")
        assert int(info.value.response.headers["retry-after"]) > 0
        assert info.value.response.headers["x-ratelimit-remaining-tokens"] == "0"
        assert len(strict.sent()) == sent  # refused at the head, never relayed
        assert_no_leases(server)
    finally:
        client.close()
        server.stop()


def test_a_client_that_sent_stream_options_gets_the_upstreams_400(
    strict: StrictUpstream,
) -> None:
    server = gateway(strict, Edge(access_log=AccessLog(stream=LogSink())), "strict-own")
    client = server.client()
    try:
        with pytest.raises(openai.BadRequestError) as info:
            chat(client, "strict-own", stream_options={"include_usage": True})
        assert info.value.status_code == 400
        error = info.value.response.json()["error"]
        assert error["param"] == "stream_options" and "stream_options" in error["message"]
        assert len(strict.sent()) == 1  # its own request, sent once
        # Once the upstream is known to refuse it, still the upstream's answer.
        assert content(chat(client, "strict-own")) == "".join(DELTAS)
        before = len(strict.sent())
        with pytest.raises(openai.BadRequestError):
            chat(client, "strict-own", stream_options={"include_usage": True})
        assert len(strict.sent()) == before + 1
        assert_no_leases(server)
    finally:
        client.close()
        server.stop()


def test_a_422_that_names_nothing_is_recognised_by_the_retry_succeeding() -> None:
    up = StrictUpstream(422, generic=True)
    sink = LogSink()
    server = gateway(up, Edge(access_log=AccessLog(stream=sink)), "strict-422")
    client = server.client()
    try:
        for n in range(2):
            got = chat(client, "strict-422", extra_headers={"x-request-id": f"s422-{n}"})
            assert content(got) == "".join(DELTAS)
            assert record(sink, f"s422-{n}")["tokens"] == len(DELTAS)
        assert [("stream_options" in b) for b in up.sent()] == [True, False, False]
    finally:
        client.close()
        server.stop()
        up.stop()


def test_one_resend_at_most_and_the_clients_own_error_relayed(
    strict: StrictUpstream,
) -> None:
    strict.bad = True  # every request is refused, with or without the option
    server = gateway(strict, Edge(access_log=AccessLog(stream=LogSink())), "strict-bad")
    client = server.client()
    try:
        with pytest.raises(openai.BadRequestError) as info:
            chat(client, "strict-bad")
        # Sent twice (with the option, then without), never more; the answer is the
        # upstream's to the client's own request.
        assert [("stream_options" in b) for b in strict.sent()] == [True, False]
        assert info.value.response.json()["error"]["param"] == "messages"
        with pytest.raises(openai.BadRequestError):
            chat(client, "strict-bad")
        assert len(strict.sent()) == 3  # known to refuse the option: sent once
        assert_no_leases(server)
    finally:
        client.close()
        server.stop()


def test_an_upstream_that_accepted_the_option_is_not_sent_a_bad_request_twice() -> None:
    up = StrictUpstream(generic=True)
    up.accepts = True  # a server that takes stream_options (and reports the usage)
    sink = LogSink()
    server = gateway(up, Edge(access_log=AccessLog(stream=sink)), "strict-ok")
    client = server.client()
    try:
        got = chat(client, "strict-ok", extra_headers={"x-request-id": "ok-usage"})
        assert content(got) == "".join(DELTAS) and all(c.choices for c in got)
        # The usage reported replaces the count of the chunks (fewer): no estimate.
        assert record(sink, "ok-usage")["tokens"] == USAGE["total_tokens"] > len(DELTAS)
        assert counter(server, "zeroserve_relay_usage_estimated_total", "strict-ok") == 0
        # Now a 400 that names nothing: the client's own bad request, relayed, sent once.
        up.bad = True
        with pytest.raises(openai.BadRequestError) as info:
            chat(client, "strict-ok")
        assert info.value.response.json()["error"]["message"] == "extra fields not permitted"
        assert [("stream_options" in b) for b in up.sent()] == [True, True]
        assert_no_leases(server)
    finally:
        client.close()
        server.stop()
        up.stop()


def test_an_upstream_that_ignores_stream_options_is_still_charged() -> None:
    # It takes the option and never sends the usage: counted from the chunks too.
    up = StrictUpstream()
    up.accepts, up.reports = True, False
    clock = ManualClock()
    key = ApiKey("user", KEY.encode(), KeyLimits(tokens_per_minute=len(DELTAS) - 1))
    server = gateway(up, Edge(EdgeOptions(keys=(key,)), clock=clock), "strict-mute")
    client = server.client(KEY)
    try:
        assert content(chat(client, "strict-mute")) == "".join(DELTAS)
        assert server.edge.statistics()["user"].tokens == len(DELTAS)
        with pytest.raises(openai.RateLimitError):
            chat(client, "strict-mute")
        assert [b.get("stream_options") for b in up.sent()] == [{"include_usage": True}]
        assert counter(server, "zeroserve_relay_usage_estimated_total", "strict-mute") == 1
        name = "zeroserve_relay_stream_options_refused_total"
        assert counter(server, name, "strict-mute") == 0
        assert_no_leases(server)
    finally:
        client.close()
        server.stop()
        up.stop()


def test_an_error_about_the_clients_own_stream_options_teaches_nothing() -> None:
    # The upstream takes stream_options but not a member it does not know: its error
    # names stream_options, yet is about the client's own object, resent as it came.
    up = StrictUpstream()
    up.accepts = True
    sink = LogSink()
    server = gateway(up, Edge(access_log=AccessLog(stream=sink)), "strict-own-opts")
    client = server.client()
    try:
        with pytest.raises(openai.BadRequestError) as info:
            chat(client, "strict-own-opts", stream_options={"include_usage": False, "x": 1})
        assert info.value.response.json()["error"]["param"] == "stream_options"
        sent = [b["stream_options"] for b in up.sent()]
        assert sent == [{"include_usage": True, "x": 1}, {"include_usage": False, "x": 1}]
        # Not taken for a refusal: the next stream still asks for (and gets) its usage.
        got = chat(client, "strict-own-opts", extra_headers={"x-request-id": "own-opts"})
        assert content(got) == "".join(DELTAS) and all(c.choices for c in got)
        assert up.sent()[-1]["stream_options"] == {"include_usage": True}
        assert record(sink, "own-opts")["tokens"] == USAGE["total_tokens"]
        assert_no_leases(server)
    finally:
        client.close()
        server.stop()
        up.stop()


def test_a_refusal_is_remembered_for_the_upstream_that_refused() -> None:
    # The first upstream refuses the option, then fails the resend with a 503: the
    # request goes to the second (which takes the option), without it. Only the first
    # may be taken for a refuser, and it is not (its resend failed): the second's next
    # stream asks for its usage and is counted exactly.
    refuser, taker = StrictUpstream(), StrictUpstream()
    refuser.overloaded = True
    taker.accepts = True
    sink = LogSink()
    edge = Edge(access_log=AccessLog(stream=sink))
    server = gateway(refuser, edge, "strict-two", "", taker)
    client = server.client()
    try:
        got = chat(client, "strict-two", extra_headers={"x-request-id": "two-1"})
        assert content(got) == "".join(DELTAS)
        assert [("stream_options" in b) for b in refuser.sent()] == [True, False]
        assert [("stream_options" in b) for b in taker.sent()] == [False]
        assert record(sink, "two-1")["tokens"] == len(DELTAS)  # estimated
        # The next request starts at the second upstream (in turn): asked, and exact.
        got = chat(client, "strict-two", extra_headers={"x-request-id": "two-2"})
        assert content(got) == "".join(DELTAS)
        assert taker.sent()[-1]["stream_options"] == {"include_usage": True}
        assert record(sink, "two-2")["tokens"] == USAGE["total_tokens"]
        assert_no_leases(server)
    finally:
        client.close()
        server.stop()
        refuser.stop()
        taker.stop()
