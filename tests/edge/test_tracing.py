"""OpenTelemetry spans with the SDK's in-memory exporter: a W3C traceparent comes in,
phases are child spans, and a gateway upstream's spans join the same trace."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import httpx
import pytest

pytest.importorskip("opentelemetry.sdk", reason="the [otel] extra is not installed")

from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import (
    InMemorySpanExporter,
)
from tests.edge.servers import EdgeServer

from zeroserve.edge import Edge
from zeroserve.edge.tracing import Tracing
from zeroserve.models.echo import EchoModel
from zeroserve.models.loader import parse_spec
from zeroserve.runtime import ModelConfig

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT_ID = "00f067aa0ba902b7"
TRACEPARENT = f"00-{TRACE_ID}-{PARENT_ID}-01"
SPANS_TIMEOUT_S = 30.0


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


@pytest.fixture
def spans() -> Iterator[tuple[TracerProvider, Recorder]]:
    recorder = Recorder(InMemorySpanExporter())
    provider = TracerProvider()
    provider.add_span_processor(recorder)
    yield provider, recorder
    provider.shutdown()


def traced(provider: TracerProvider, configs: dict[str, ModelConfig]) -> EdgeServer:
    edge = Edge(tracing=Tracing(provider.get_tracer("test")))
    return EdgeServer(configs, edge).start()


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
        got = recorder.wait_for(4)
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
