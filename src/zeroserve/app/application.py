"""The application: routes requests to endpoint handlers. No sockets here."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from ..edge import Edge
from ..http.connection import RequestHead
from ..runtime import Engine
from .endpoints import kserve, openai, openapi, ops, raw, stats
from .endpoints import ui as page
from .engine_relay import close_engine_relays, engine_relays
from .limits import ApiLimits
from .problems import ErrorFormat
from .relay import aclose_relays, relays
from .request import Request
from .response import HandlerResult
from .router import Router


class App:
    """Routes a request at its head (so 404/405/429 are answered before the body is
    read) and hands the complete request to its handler. ``ui`` serves the playground
    and dashboard page at ``/`` (``/v1/stats`` is served either way)."""

    def __init__(
        self,
        engine: Engine,
        edge: Edge | None = None,
        *,
        metrics_view: Callable[[], Awaitable[bytes]] | None = None,
        ui: bool = True,
        limits: ApiLimits | None = None,
    ) -> None:
        self.engine = engine
        self.edge = edge if edge is not None else Edge()
        self.limits = limits or ApiLimits()
        self.readiness = ops.Readiness()
        self.router = Router()
        ops.register(self.router, engine, self.readiness, metrics_view)
        raw.register(self.router, engine, self.limits)
        # Remote models' relays, made now so their upstream metrics show from the start.
        self.relays = relays(engine)
        self.engine_relays = engine_relays(engine)  # llamacpp models: their slot metrics
        openai.register(self.router, engine, self.limits)
        kserve.register(self.router, engine, self.limits)
        stats.register(self.router, engine)
        if ui:
            page.register(self.router)
        openapi.register(self.router)  # last: it describes every route above

    def on_head(self, head: RequestHead) -> Request:
        route, params = self.router.match(head.method, head.path)
        req = Request(head, params, route)
        if route.on_head is not None:
            route.on_head(req)
        return req

    def handle(self, req: Request) -> HandlerResult:
        return req.route.handler(req)

    def error_format(self, path: str) -> ErrorFormat:
        return self.router.route_errors(path)

    def start_draining(self) -> None:
        """From now on ``/ready`` answers 503 (the server is draining)."""
        self.readiness.draining = True

    async def aclose(self) -> None:
        """Close what the app holds open (the relays' upstream connections, the access
        log's writer)."""
        await aclose_relays(self.engine)
        self.edge.close()
        close_engine_relays(self.engine)
