"""The application: routes requests to endpoint handlers. No sockets here."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from ..edge import Edge, EdgeContext
from ..errors import ZeroserveError
from ..http.connection import RequestHead
from ..runtime import Engine
from ..runtime.model_manager import ModelManager
from . import control
from .anthropic import routes as anthropic
from .backends import Backends
from .backends.images import ImageFetchPolicy
from .batch import BatchApi, BatchOptions
from .endpoints import openapi, ops, raw, stats
from .endpoints import ui as page
from .extensions import routes as extensions
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
    and dashboard page at ``/`` (``/v1/stats`` is served either way). ``models``: the
    model manager, when models come and go at run time (the control routes, the whole
    catalog in ``/v1/models``; ``autoload``: a request loads the model it names)."""

    def __init__(
        self,
        engine: Engine,
        edge: Edge | None = None,
        *,
        metrics_view: Callable[[], Awaitable[bytes]] | None = None,
        ui: bool = True,
        limits: ApiLimits | None = None,
        models: ModelManager | None = None,
        autoload: bool = False,
        batch: BatchOptions | None = None,
        image_fetch: ImageFetchPolicy | None = None,
    ) -> None:
        self.engine = engine
        self.edge = edge if edge is not None else Edge()
        self.limits = limits or ApiLimits()
        self.readiness = ops.Readiness()
        self.router = Router()
        # Every model's backend, chosen once (docs/architecture.md, "Adding a backend").
        self.backends = Backends(engine, image_fetch)
        self.models = models
        if models is not None:  # docs/architecture.md, "Models at run time"
            models.listener = self.backends
            self.backends.keep_alive = models.ask_keep_alive
            if autoload:
                self.backends.autoload = control.ManagerAutoload(models, engine)
        ops.register(self.router, engine, self.readiness, metrics_view)
        raw.register(self.router, engine, self.backends, self.limits)
        openai.register(self.router, engine, self.backends, self.limits, models)
        anthropic.register(self.router, self.backends, self.limits)
        extensions.register(self.router, self.backends, self.limits)
        kserve.register(self.router, engine, self.limits, self.backends)
        stats.register(self.router, engine)
        if models is not None:
            control.register(self.router, models, keyed=self.edge.keys is not None)
        # The Files and Batch APIs, with --data-dir only (docs/architecture.md, "The Batch API").
        self.batch = BatchApi(batch, self.router, engine, self.edge) if batch else None
        if self.batch is not None:
            self.batch.register(self.router)
        if ui:
            page.register(self.router)
        openapi.register(self.router, self.limits)  # last: it describes every route above

    def on_head(self, head: RequestHead, edge: EdgeContext | None = None) -> Request:
        route, params = self.router.match(head.method, head.path)
        req = Request(head, params, route)
        req.edge = edge  # before the head hook: it may admit by the key's priority class
        if route.on_head is not None:
            route.on_head(req)
        return req

    def handle(self, req: Request) -> HandlerResult:
        return req.route.handler(req)

    def error_format(self, path: str) -> ErrorFormat:
        return self.router.route_errors(path)

    def error_body(self, exc: ZeroserveError, fmt: ErrorFormat) -> bytes:
        return error_body(exc, fmt)

    def start(self) -> None:
        """Start the app's own work on the running loop (the batch runner)."""
        if self.batch is not None:
            self.batch.start()

    def start_draining(self) -> None:
        """From now on ``/ready`` answers 503 (the server is draining)."""
        self.readiness.draining = True

    async def aclose(self) -> None:
        """Close what the app holds open (the backends: the relays' upstream connections;
        the access log's writer)."""
        if self.batch is not None:
            await self.batch.aclose()  # before the backends its lines use
        await self.backends.aclose()
        self.edge.close()
