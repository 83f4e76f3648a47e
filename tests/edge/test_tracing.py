"""OpenTelemetry spans with the SDK's in-memory exporter: a W3C traceparent comes in,
phases are child spans, and a gateway upstream's spans join the same trace."""

from __future__ import annotations

import http.server
import os
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest

pytest.importorskip("opentelemetry.sdk", reason="the [otel] extra is not installed")

from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import (
    InMemorySpanExporter,
)

from tests.support import ROOT, ServerThread, model_scaled, scaled
from tests.support.models.misbehaving import StallModel
from tests.support.smollm2 import require_llamacpp, smollm2_config
from zeroserve.edge import Edge
from zeroserve.edge.tracing import Tracing
from zeroserve.models.base import ExecutorKind
from zeroserve.models.echo import EchoModel
from zeroserve.models.loader import parse_spec
from zeroserve.runtime import ModelConfig

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT_ID = "00f067aa0ba902b7"
TRACEPARENT = f"00-{TRACE_ID}-{PARENT_ID}-01"
SPANS_TIMEOUT_S = scaled(30.0)


class Recorder(SimpleSpanProcessor):
    """Exports to memory and wakes a waiting test when a span ends."""

    def __init__(self, exporter: InMemorySpanExporter) -> None:
        super().__init__(exporter)
        self.exporter = exporter
        self.ended = threading.Condition()

    def on_end(self, span: ReadableSpan) -> None:
        super().on_end(span)
        with self.ended:
            self.ended.notify_all()

    def wait_for(self, count: int) -> list[ReadableSpan]:
        # Spans end on the server's loop after the last byte is sent: wait for them.
        with self.ended:
            assert self.ended.wait_for(
                lambda: len(self.exporter.get_finished_spans()) >= count, SPANS_TIMEOUT_S
            ), [s.name for s in self.exporter.get_finished_spans()]
        return list(self.exporter.get_finished_spans())

    def wait_for_span(self, match: Callable[[ReadableSpan], bool]) -> ReadableSpan:
        def found() -> ReadableSpan | None:
            return next((s for s in self.exporter.get_finished_spans() if match(s)), None)

        with self.ended:
            assert self.ended.wait_for(lambda: found() is not None, SPANS_TIMEOUT_S), [
                s.name for s in self.exporter.get_finished_spans()
            ]
        span = found()
        assert span is not None
        return span


@pytest.fixture
def spans() -> Iterator[tuple[TracerProvider, Recorder]]:
    recorder = Recorder(InMemorySpanExporter())
    provider = TracerProvider()
    provider.add_span_processor(recorder)
    yield provider, recorder
    provider.shutdown()


def traced(provider: TracerProvider, configs: dict[str, ModelConfig]) -> ServerThread:
    edge = Edge(tracing=Tracing(provider.get_tracer("test")))
    return ServerThread(configs, edge=edge).start()


def test_a_stream_has_admission_execution_and_stream_spans_under_the_callers_trace(
    spans: tuple[TracerProvider, Recorder],
) -> None:
    provider, recorder = spans
    server = traced(provider, {"echo": ModelConfig("echo", EchoModel)})
    try:
        body = {"model": "echo", "prompt": "a b", "max_tokens": 6, "stream": True}
        r = httpx.post(
            server.url + "/v1/completions", json=body, headers={"traceparent": TRACEPARENT}
        )
        assert r.status_code == 200 and r.text.endswith("data: [DONE]\n\n")
        got = recorder.wait_for(5)
    finally:
        server.stop()
    by_name = {s.name: s for s in got}
    root = by_name["POST /v1/completions"]
    assert root.context is not None and root.parent is not None
    assert format(root.context.trace_id, "032x") == TRACE_ID
    assert format(root.parent.span_id, "016x") == PARENT_ID
    assert root.attributes is not None
    assert root.attributes["http.response.status_code"] == 200
    assert root.attributes["zeroserve.model"] == "echo"
    assert root.attributes["zeroserve.tokens"] == 8
    assert root.attributes["zeroserve.request_id"] == r.headers["x-request-id"]
    phases = [by_name[n] for n in ("admission", "execution", "stream")]
    for span in phases:
        assert span.parent is not None and span.parent.span_id == root.context.span_id
        assert span.context is not None and span.context.trace_id == root.context.trace_id
    starts = [s.start_time or 0 for s in phases]
    assert starts == sorted(starts)
    # The generation waited for the loop to start it: a queue span inside execution.
    queue, execution = by_name["queue"], by_name["execution"]
    assert queue.parent is not None and execution.context is not None
    assert queue.parent.span_id == execution.context.span_id
    assert queue.attributes is not None and queue.attributes["zeroserve.started"] is True


def _children(got: list[ReadableSpan], parent: ReadableSpan) -> list[str]:
    assert parent.context is not None
    return sorted(
        s.name for s in got if s.parent is not None and s.parent.span_id == parent.context.span_id
    )


@pytest.mark.parametrize("executor", ["thread", "process"])
@pytest.mark.parametrize("stream", [False, True])
def test_work_waiting_for_a_worker_gets_a_queue_span_inside_execution(
    spans: tuple[TracerProvider, Recorder], executor: ExecutorKind, stream: bool
) -> None:
    provider, recorder = spans
    server = traced(provider, {"echo": ModelConfig("echo", EchoModel, executor=executor)})
    try:
        url = server.url + "/v1/raw/echo" + ("?stream=1" if stream else "")
        r = httpx.post(url, content=b"a b c", timeout=SPANS_TIMEOUT_S)
        assert r.status_code == 200
        got = recorder.wait_for(5 if stream else 4)
    finally:
        server.stop()
    by_name = {s.name: s for s in got}
    root = by_name["POST /v1/raw/{model}"]
    expected = ["admission", "execution", "stream"] if stream else ["admission", "execution"]
    assert _children(got, root) == expected
    assert _children(got, by_name["execution"]) == ["queue"]
    queue = by_name["queue"]
    assert queue.attributes is not None and queue.attributes["zeroserve.started"] is True
    assert queue.context is not None and root.context is not None
    assert queue.context.trace_id == root.context.trace_id


def test_work_run_at_once_on_the_loop_has_no_queue_span(
    spans: tuple[TracerProvider, Recorder],
) -> None:
    """A sync inline model's raw infer runs in the I/O callback (no queue to wait in)."""
    provider, recorder = spans
    server = traced(provider, {"echo": ModelConfig("echo", EchoModel)})
    try:
        r = httpx.post(server.url + "/v1/raw/echo", content=b"abc")
        assert r.content == b"abc"
        got = recorder.wait_for(3)
    finally:
        server.stop()
    assert sorted(s.name for s in got) == ["POST /v1/raw/{model}", "admission", "execution"]


def test_work_that_expires_while_queued_ends_its_queue_span_unstarted(
    spans: tuple[TracerProvider, Recorder],
) -> None:
    """One worker, held by a call that never returns: the next request waits in the queue
    until its own deadline (504), and its queue span ends with it, marked not started."""
    provider, recorder = spans
    config = ModelConfig("stall", StallModel, workers=1, max_batch_size=1)
    server = traced(provider, {"stall": config})
    try:
        # The held request is a raw socket the test closes once the second one has its
        # 504: the disconnect cancels the stalled call, so the server stops at once.
        with socket.create_connection(("127.0.0.1", server.port)) as held:
            held.sendall(b"POST /v1/raw/stall HTTP/1.1\r\nhost: t\r\ncontent-length: 1\r\n\r\nx")
            # The first request's slot started it: its queue span has ended.
            recorder.wait_for_span(
                lambda s: s.name == "queue" and _attr(s, "zeroserve.started") is True
            )
            r = httpx.post(
                server.url + "/v1/raw/stall",
                content=b"x",
                headers={"request-timeout": "0.2"},
                timeout=SPANS_TIMEOUT_S,
            )
            assert r.status_code == 504
            waited = recorder.wait_for_span(
                lambda s: s.name == "queue" and _attr(s, "zeroserve.started") is False
            )
    finally:
        server.stop()
    got = recorder.exporter.get_finished_spans()
    execution = next(
        s
        for s in got
        if s.name == "execution"
        and waited.parent is not None
        and s.context is not None
        and s.context.span_id == waited.parent.span_id
    )
    root = next(
        s
        for s in got
        if s.context is not None
        and execution.parent is not None
        and s.context.span_id == execution.parent.span_id
    )
    assert _attr(root, "http.response.status_code") == 504
    assert _attr(root, "zeroserve.outcome") == "deadline"


def _span_id(span: ReadableSpan) -> int:
    assert span.context is not None
    return span.context.span_id


def _attr(span: ReadableSpan, name: str) -> object:
    return None if span.attributes is None else span.attributes.get(name)


def test_gateway_upstreams_join_the_trace(
    spans: tuple[TracerProvider, Recorder],
) -> None:
    provider, recorder = spans
    upstream = traced(provider, {"echo": ModelConfig("echo", EchoModel)})
    try:
        spec = parse_spec(f"g=remote:{upstream.url}/v1?upstream_model=echo")
        gw_configs = {
            "g": ModelConfig("g", spec.load_class(), options=spec.options, **spec.runtime)
        }
        gateway = traced(provider, gw_configs)
        try:
            r = httpx.post(
                gateway.url + "/v1/raw/g",
                content=b"hello",
                headers={"traceparent": TRACEPARENT, "x-request-id": "gw-1"},
            )
            assert r.content == b"hello"
            got = recorder.wait_for(6)
        finally:
            gateway.stop()
    finally:
        upstream.stop()
    roots = [s for s in got if s.name.startswith("POST /v1/raw/")]
    assert len(roots) == 2
    gw_root = next(
        s for s in roots if s.parent is not None and format(s.parent.span_id, "016x") == PARENT_ID
    )
    up_root = next(s for s in roots if s is not gw_root)
    assert (
        gw_root.context is not None and up_root.context is not None and up_root.parent is not None
    )
    assert up_root.context.trace_id == gw_root.context.trace_id
    assert up_root.parent.span_id == gw_root.context.span_id
    assert up_root.attributes is not None and up_root.attributes["zeroserve.request_id"] == "gw-1"


# -- OTLP export, end to end --------------------------------------------------------------
class _Collector(http.server.ThreadingHTTPServer):
    """A real OTLP/HTTP receiver on loopback: keeps every ``/v1/traces`` export."""

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _CollectorHandler)
        self.exports: list[bytes] = []
        self.received = threading.Condition()

    def spans(self) -> list[Any]:
        from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
            ExportTraceServiceRequest,
        )

        out = []
        for body in self.exports:
            req = ExportTraceServiceRequest.FromString(body)
            for rs in req.resource_spans:
                service = {a.key: a.value.string_value for a in rs.resource.attributes}
                for ss in rs.scope_spans:
                    out += [(service.get("service.name"), s) for s in ss.spans]
        return out


class _CollectorHandler(http.server.BaseHTTPRequestHandler):
    server: _Collector

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers["content-length"]))
        ok = self.path == "/v1/traces"
        self.send_response(200 if ok else 404)
        self.send_header("content-length", "0")
        self.end_headers()
        if ok:
            with self.server.received:
                self.server.exports.append(body)
                self.server.received.notify_all()

    def log_message(self, format: str, *args: Any) -> None:
        pass


def test_otel_exports_the_spans_over_otlp_http() -> None:
    pytest.importorskip("opentelemetry.exporter.otlp.proto.http")
    collector = _Collector()
    receiver = threading.Thread(target=collector.serve_forever, daemon=True)
    receiver.start()
    env = dict(
        os.environ,
        OTEL_EXPORTER_OTLP_ENDPOINT=f"http://127.0.0.1:{collector.server_address[1]}",
        OTEL_BSP_SCHEDULE_DELAY="50",  # ms: export soon after the request
        PYTHONUNBUFFERED="1",
        PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
    )
    argv = [sys.executable, "-m", "zeroserve", "serve", "--host", "127.0.0.1", "--port", "0"]
    proc = subprocess.Popen(
        [*argv, "--model", "echo", "--otel"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        env=env,
        cwd=ROOT,
    )
    try:
        url = _serving_url(proc)
        r = httpx.post(url + "/v1/raw/echo", content=b"hi", headers={"traceparent": TRACEPARENT})
        assert r.content == b"hi"

        def exported() -> bool:
            return any(s.name == "POST /v1/raw/{model}" for _, s in collector.spans())

        with collector.received:
            assert collector.received.wait_for(exported, SPANS_TIMEOUT_S)
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(SPANS_TIMEOUT_S)
        collector.shutdown()
        collector.server_close()
        if proc.stdout is not None:
            proc.stdout.close()
    spans = collector.spans()
    root = next(s for _, s in spans if s.name == "POST /v1/raw/{model}")
    assert root.trace_id.hex() == TRACE_ID and root.parent_span_id.hex() == PARENT_ID
    assert {service for service, _ in spans} == {"zeroserve"}
    children = {s.name for _, s in spans if s.parent_span_id == root.span_id}
    assert {"admission", "execution"} <= children


def _serving_url(proc: subprocess.Popen[bytes]) -> str:
    """Read the output until the server says where it listens (it exits on failure, so
    the read ends either way)."""
    assert proc.stdout is not None
    seen = []
    for line in iter(proc.stdout.readline, b""):
        seen.append(line)
        if b" serving [" in line:
            return "http://" + line.rsplit(b"http://", 1)[1].strip().decode()
    raise AssertionError("server did not start:\n" + b"".join(seen).decode())


def test_each_choice_of_an_openai_request_gets_its_own_queue_span(
    spans: tuple[TracerProvider, Recorder],
) -> None:
    provider, recorder = spans
    server = traced(provider, {"echo": ModelConfig("echo", EchoModel, executor="thread")})
    try:
        body = {"model": "echo", "prompt": "a b", "max_tokens": 2, "n": 2, "stream": True}
        r = httpx.post(server.url + "/v1/completions", json=body, timeout=SPANS_TIMEOUT_S)
        assert r.status_code == 200 and r.text.endswith("data: [DONE]\n\n")
        got = recorder.wait_for(6)  # server, admission, execution, 2 x queue, stream
    finally:
        server.stop()
    by_name = {s.name: s for s in got}
    queues = [s for s in got if s.name == "queue"]
    assert len(queues) == 2
    # A choice is a child of the phase open when it was handed to the model: the first
    # during execution; a later one may start once the stream is under way.
    phases = {_span_id(by_name[n]): n for n in ("execution", "stream")}
    parents = [phases.get(q.parent.span_id) if q.parent is not None else None for q in queues]
    assert "execution" in parents and set(parents) <= {"execution", "stream"}
    assert all(_attr(q, "zeroserve.started") is True for q in queues)


# It waits on smollm2's niced decode: its answer's bound and pytest-timeout's are scaled by
# model_slowdown (docs/decisions/0055-model-waits-scaled-for-the-niced-share.md).
@pytest.mark.niced
@pytest.mark.parametrize("n", [1, 2])
def test_engine_requests_wait_for_a_slot_in_a_queue_span(
    spans: tuple[TracerProvider, Recorder], n: int
) -> None:
    """The llama.cpp engine schedules its own slots: each engine request's wait for one
    (one per choice) is a ``queue`` span inside execution."""
    require_llamacpp()
    provider, recorder = spans
    server = traced(provider, {"smollm2": smollm2_config(parallel=1, n_ctx=256)})
    try:
        body = {"model": "smollm2", "prompt": "Hi", "max_tokens": 2, "n": n, "seed": 1}
        r = httpx.post(server.url + "/v1/completions", json=body, timeout=model_scaled(30.0))
        assert r.status_code == 200 and len(r.json()["choices"]) == n
        got = recorder.wait_for(3 + n)
    finally:
        server.stop()
    by_name = {s.name: s for s in got}
    root = by_name["POST /v1/completions"]
    assert _children(got, root) == ["admission", "execution"]
    assert _children(got, by_name["execution"]) == ["queue"] * n
    for queue in (s for s in got if s.name == "queue"):
        assert queue.attributes is not None and queue.attributes["zeroserve.started"] is True
