"""OpenTelemetry tracing (the optional ``[otel]`` extra).

Strategy
--------
A request's W3C ``traceparent``/``tracestate`` become the parent of one server span,
``"{METHOD} {path}"``, opened by ``Edge.start`` and closed by ``Edge.finish`` with the
status. Inside it, the request's phases follow one another as child spans, each ended
when the next begins: ``admission`` (key, quota, routing and the model's queue
admission, at the head), ``execution`` (from the complete request to the response head
or first stream piece: queue wait and model time), ``stream`` (first piece to last).
Each piece of work handed to a model's queue (a request's infer or embed, each generation
of a stream) gets a ``queue`` span, a child of the phase open at the hand-off (``execution``;
a later choice of a multi-choice stream may start during ``stream``), from the hand-off to the moment
a worker or slot starts it (the runtime's ``QueueWatch``); one still waiting when the
request ends (cancelled, expired) ends then, with ``zeroserve.started`` false.
Gateway upstreams get ``traceparent`` of the server span, so their spans join the trace.

Nothing here is imported unless tracing is on; with it off, a request pays one ``None``
check per phase.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from ..errors import ZeroserveError

_MISSING = "tracing needs the optional [otel] extra: pip install 'zeroserve[otel]'"

Headers = list[tuple[bytes, bytes]]
_CONTEXT_HEADERS = (b"traceparent", b"tracestate")


class QueueSpan:
    """One piece of work's wait in a model's queue: ``queued()`` opens the ``queue`` span
    (a child of the phase open then), ``started()`` ends it. The runtime calls each at
    most once; a call out of turn does nothing."""

    __slots__ = ("_rt", "span")

    def __init__(self, rt: RequestTrace) -> None:
        self._rt = rt
        self.span: Any = None

    def queued(self) -> None:
        rt = self._rt
        if self.span is not None or rt.ended:
            return
        parent = rt.phase if rt.phase is not None else rt.span
        self.span = rt._tracing.child("queue", parent)
        rt.queues.append(self)

    def started(self) -> None:
        span, self.span = self.span, None
        if span is None:
            return
        span.set_attribute("zeroserve.started", True)
        span.end()
        self._rt.queues.remove(self)

    def abandon(self) -> None:
        """The request ended while this work still waited."""
        span, self.span = self.span, None
        if span is not None:
            span.set_attribute("zeroserve.started", False)
            span.end()


class RequestTrace:
    """The spans of one request: the server span, the phase open now and the queue
    waits not yet over."""

    __slots__ = ("_tracing", "ended", "method", "phase", "queues", "span")

    def __init__(self, tracing: Tracing, span: Any, method: str) -> None:
        self._tracing = tracing
        self.span = span
        self.method = method
        self.phase: Any = None
        self.queues: list[QueueSpan] = []
        self.ended = False

    def upstream_headers(self) -> Headers:
        return self._tracing.headers(self)

    def enter(self, phase: str | None) -> None:
        """End the phase open now and begin ``phase`` (None: just end it)."""
        self._tracing.phase(self, phase)

    def queue_watch(self) -> QueueSpan:
        """A watch for one piece of work handed to a model (the runtime's ``QueueWatch``)."""
        return QueueSpan(self)


class Tracing:
    """Spans from ``tracer`` (an OpenTelemetry ``Tracer``; the global provider's when
    None, which ``configure_otlp`` points at an OTLP exporter)."""

    def __init__(self, tracer: Any = None) -> None:
        try:
            from opentelemetry import trace
            from opentelemetry.trace.propagation.tracecontext import (
                TraceContextTextMapPropagator,
            )
        except ImportError:
            raise ZeroserveError(_MISSING) from None

        self._trace = trace
        self._tracer = tracer if tracer is not None else trace.get_tracer("zeroserve")
        self._propagator = TraceContextTextMapPropagator()
        self._server_kind = trace.SpanKind.SERVER

    def start(self, method: str, path: str, headers: Iterable[tuple[bytes, bytes]]) -> RequestTrace:
        carrier = {
            name.decode("latin-1"): value.decode("latin-1")
            for name, value in headers
            if name in _CONTEXT_HEADERS
        }
        parent = self._propagator.extract(carrier) if carrier else None
        span = self._tracer.start_span(
            f"{method} {path}",
            context=parent,
            kind=self._server_kind,
            attributes={"http.request.method": method, "url.path": path},
        )
        return RequestTrace(self, span, method)

    def phase(self, rt: RequestTrace, name: str | None) -> None:
        """End the phase open now and begin ``name`` (None: just end it)."""
        if rt.phase is not None:
            rt.phase.end()
            rt.phase = None
        if name is not None:
            rt.phase = self.child(name, rt.span)

    def child(self, name: str, parent: Any) -> Any:
        return self._tracer.start_span(name, context=self._trace.set_span_in_context(parent))

    def routed(self, rt: RequestTrace, route: str) -> None:
        """Name the server span by its route pattern (low cardinality, as OpenTelemetry's
        HTTP conventions ask) once routing knows it."""
        rt.span.update_name(f"{rt.method} {route}")
        rt.span.set_attribute("http.route", route)

    def finish(
        self, rt: RequestTrace, status: int, outcome: str, attributes: dict[str, Any]
    ) -> None:
        rt.ended = True
        for waiting in rt.queues:
            waiting.abandon()
        rt.queues.clear()
        if rt.phase is not None:
            rt.phase.end()
            rt.phase = None
        span = rt.span
        span.set_attribute("http.response.status_code", status)
        span.set_attribute("zeroserve.outcome", outcome)
        for key, value in attributes.items():
            if value is not None:
                span.set_attribute(key, value)
        if status >= 500 or outcome == "error":
            span.set_status(self._trace.Status(self._trace.StatusCode.ERROR))
        span.end()

    def headers(self, rt: RequestTrace) -> Headers:
        """``traceparent`` (and ``tracestate``) naming the server span, for upstreams."""
        carrier: dict[str, str] = {}
        self._propagator.inject(carrier, context=self._trace.set_span_in_context(rt.span))
        return [(k.encode("latin-1"), v.encode("latin-1")) for k, v in carrier.items()]


def configure_otlp(service_name: str = "zeroserve") -> None:
    """Install a global tracer provider exporting over OTLP/HTTP in batches. The endpoint
    and headers come from the standard ``OTEL_EXPORTER_OTLP_*`` environment variables."""
    try:
        from opentelemetry import trace
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
    except ImportError:
        raise ZeroserveError(_MISSING) from None

    provider = TracerProvider(resource=Resource.create({"service.name": service_name}))
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
    trace.set_tracer_provider(provider)
