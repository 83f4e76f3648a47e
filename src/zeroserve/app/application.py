"""The application: routes requests to endpoint handlers. No sockets here."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from ..edge import Edge
from ..errors import ZeroserveError
from ..http.connection import RequestHead
from ..runtime import Engine
from .anthropic import routes as anthropic
from .backends import Backends
from .backends.images import ImageFetchPolicy
from .endpoints import openapi, ops, raw, stats
from .endpoints import ui as page
from .kserve import routes as kserve
from .limits import ApiLimits
from .openai import routes as openai
from .problems import ErrorFormat, error_body
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
        image_fetch: ImageFetchPolicy | None = None,
    ) -> None:
        self.engine = engine
        self.edge = edge if edge is not None else Edge()
        self.limits = limits or ApiLimits()
        self.readiness = ops.Readiness()
        self.router = Router()
        # Every model's backend, chosen once (docs/architecture.md, "Adding a backend").
        self.backends = Backends(engine, image_fetch)
        ops.register(self.router, engine, self.readiness, metrics_view)
        raw.register(self.router, engine, self.backends, self.limits)
        openai.register(self.router, engine, self.backends, self.limits)
        anthropic.register(self.router, self.backends, self.limits)
        kserve.register(self.router, engine, self.limits)
        stats.register(self.router, engine)
        if ui:
            page.register(self.router)
        openapi.register(self.router, self.limits)  # last: it describes every route above

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

    def error_body(self, exc: ZeroserveError, fmt: ErrorFormat) -> bytes:
        return error_body(exc, fmt)

    def start_draining(self) -> None:
        """From now on ``/ready`` answers 503 (the server is draining)."""
        self.readiness.draining = True

    async def aclose(self) -> None:
        """Close what the app holds open (the backends: the relays' upstream connections;
        the access log's writer)."""
        await self.backends.aclose()
        self.edge.close()
