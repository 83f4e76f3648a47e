"""What the server needs of the application it hosts: a small protocol the server owns
(docs/architecture.md, "server/: asyncio glue"), so that ``server/`` calls the app
through types, natively in the compiled build, and knows nothing else of it."""

from __future__ import annotations

from typing import Protocol

from ..app.problems import ErrorFormat
from ..app.request import Request
from ..app.response import HandlerResult
from ..edge import Edge, EdgeContext
from ..errors import ZeroserveError
from ..http.connection import RequestHead


class HostedApp(Protocol):
    """An application the server hosts (``app.App``)."""

    @property
    def edge(self) -> Edge:
        """The request head's edge: keys, quotas, CORS, request ids, the access log."""
        ...

    def on_head(self, head: RequestHead, edge: EdgeContext | None = None) -> Request:
        """Route a request at its head (before its body is read), knowing what the edge
        decided (its API key: the route's head hook may admit by its priority class);
        raise a ``ZeroserveError`` to answer it at once."""
        ...

    def handle(self, req: Request) -> HandlerResult:
        """Handle a complete request."""
        ...

    def error_format(self, path: str) -> ErrorFormat:
        """The error format of the API ``path`` belongs to (errors before routing)."""
        ...

    def error_body(self, exc: ZeroserveError, fmt: ErrorFormat) -> bytes:
        """The body of ``exc``'s answer in ``fmt``."""
        ...

    def start_draining(self) -> None:
        """The server drains (SIGTERM): readiness answers 503 from now on."""
        ...
