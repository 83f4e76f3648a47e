"""Operational endpoints: liveness, readiness, Prometheus metrics. All cheap and
loop-local, so they stay fast however busy the models are (W8)."""

from __future__ import annotations

from ... import metrics
from ...runtime import Engine
from ..request import Request
from ..response import Response, json_response
from ..router import Router

_OK = json_response({"status": "ok"})
_PROM = b"text/plain; version=0.0.4; charset=utf-8"


def register(router: Router, engine: Engine) -> None:
    def health(req: Request) -> Response:
        return _OK

    def ready(req: Request) -> Response:
        if engine.ready():
            return _OK
        return json_response({"status": "unavailable", "detail": engine.status()}, 503)

    def metrics_endpoint(req: Request) -> Response:
        return Response(200, [metrics.exposition()], content_type=_PROM)

    router.add("GET", "/health", health)
    router.add("GET", "/ready", ready)
    router.add("GET", "/metrics", metrics_endpoint)
