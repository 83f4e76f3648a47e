"""The application: routes requests to endpoint handlers. No sockets here."""

from __future__ import annotations

from ..http.connection import RequestHead
from ..runtime import Engine
from .endpoints import kserve, openai, ops, raw
from .limits import ApiLimits
from .problems import ErrorFormat
from .relay import aclose_relays, relays
from .request import Request
from .response import HandlerResult
from .router import Router


class App:
    """Routes a request at its head (so 404/405/429 are answered before the body is
    read) and hands the complete request to its handler."""

    def __init__(self, engine: Engine, limits: ApiLimits | None = None) -> None:
        self.engine = engine
        self.limits = limits or ApiLimits()
        self.router = Router()
        ops.register(self.router, engine)
        raw.register(self.router, engine)
        # Remote models' relays, made now so their upstream metrics show from the start.
        self.relays = relays(engine)
        openai.register(self.router, engine, self.limits)
        kserve.register(self.router, engine, self.limits)

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

    async def aclose(self) -> None:
        """Close what the app holds open (the relays' upstream connections)."""
        await aclose_relays(self.engine)
