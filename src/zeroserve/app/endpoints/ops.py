"""Operational endpoints: liveness, readiness, Prometheus metrics. All cheap and
loop-local, so they stay fast however busy the models are (W8)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import msgspec

from ... import metrics
from ...runtime import Engine
from ..request import Request
from ..response import Response, json_response
from ..router import RouteDoc, Router

_OK = json_response({"status": "ok"})


class _Status(msgspec.Struct):
    status: str


_PROM = b"text/plain; version=0.0.4; charset=utf-8"


_DRAINING = json_response({"status": "draining"}, 503)


class Readiness:
    """Whether the server still wants traffic: false once it drains after SIGTERM, so
    load balancers stop sending before the listener closes."""

    __slots__ = ("draining",)

    def __init__(self) -> None:
        self.draining = False


def register(
    router: Router,
    engine: Engine,
    readiness: Readiness,
    metrics_view: Callable[[], Awaitable[bytes]] | None = None,
) -> None:
    def health(req: Request) -> Response:
        return _OK

    def ready(req: Request) -> Response:
        if readiness.draining:
            return _DRAINING
        if engine.ready():
            return _OK
        return json_response({"status": "unavailable", "detail": engine.status()}, 503)

    def metrics_endpoint(req: Request) -> Response:
        return Response(200, [metrics.exposition()], content_type=_PROM)

    async def merged_metrics(req: Request) -> Response:
        assert metrics_view is not None
        return Response(200, [await metrics_view()], content_type=_PROM)

    status = _Status
    router.add("GET", "/health", health, doc=RouteDoc("Liveness", None, status))
    router.add("GET", "/ready", ready, doc=RouteDoc("Readiness: every model loaded", None, status))
    router.add(
        "GET",
        "/metrics",
        metrics_endpoint if metrics_view is None else merged_metrics,
        doc=RouteDoc("Prometheus metrics (text exposition)"),
    )
