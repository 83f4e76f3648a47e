"""The request as the app layer sees it: a parsed head plus a zero-copy body view.

Ownership (docs/architecture.md, "Adding an endpoint"): a request owns at most one
admission :class:`~zeroserve.runtime.Ticket` and one body lease. The head hook admits
(:meth:`Request.admit`); the handler hands the ticket on with :meth:`Request.take_ticket`
(the slot is then empty: the engine, or the stream it returns, owns it); the server calls
:meth:`Request.release` exactly once when the request is over, which returns whatever
the request still owns.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol
from urllib.parse import parse_qsl

from .. import metrics
from ..edge import EdgeContext
from ..http.connection import RequestHead
from ..runtime import Lease, ModelHandle, Ticket
from ..runtime.classes import Priority
from .apidoc import RouteDoc
from .priorities import PRIORITY_HEADER, checked, head_priority
from .problems import ErrorFormat
from .response import HandlerResult


class BodyStore(Protocol):
    """Where a route has a request's body stored as it arrives, instead of whole in an
    arena lease (an upload written to disk): ``write`` consumes each received part (a
    transient view); ``discard`` drops what was stored when the request ends without
    its handler taking the store (``Request.take_body_store``)."""

    def write(self, data: memoryview) -> None: ...

    def discard(self) -> None: ...


Handler = Callable[["Request"], HandlerResult]
HeadHook = Callable[["Request"], None]  # may raise; runs before the body is read


@dataclass(slots=True)
class Route:
    """One route of the router: its handler, head hook, error format and description."""

    method: str
    pattern: str
    handler: Handler
    errors: ErrorFormat = "openai"
    on_head: HeadHook | None = None
    name: str = ""
    doc: RouteDoc | None = None
    segments: tuple[str, ...] = field(default=())
    # Observes a request's duration (seconds). The histogram child is looked up once per
    # route rather than per request (labels() takes a lock and walks a dict).
    timer: Callable[[float], None] = field(default=lambda seconds: None)

    def __post_init__(self) -> None:
        self.timer = metrics.request_timer(self.pattern)


class Request:
    """One HTTP request. ``body`` is a view of the buffer the body was received into
    (``lease``, for Content-Length bodies); it stays valid until the response has been
    sent. ``handle`` is the model handle the head hook resolved (:meth:`admit`). ``edge``
    is what the edge decided at the head (request id, API key name, quota); handlers name
    the model and count tokens on it."""

    __slots__ = (
        "_disconnected",
        "_handle",
        "_pinned",
        "_priority",
        "_query",
        "_released",
        "_ticket",
        "body",
        "body_store",
        "edge",
        "head",
        "lease",
        "loopback",
        "params",
        "route",
    )

    def __init__(self, head: RequestHead, params: dict[str, str], route: Route) -> None:
        self.head = head
        self.params = params
        self.route = route
        self.body: memoryview = memoryview(b"")
        self.lease: Lease | None = None
        self.body_store: BodyStore | None = None
        self._handle: ModelHandle | None = None
        self._ticket: Ticket | None = None
        self._released = False
        self.edge: EdgeContext | None = None
        self._disconnected: asyncio.Event | None = None
        self._query: dict[str, str] | None = None
        # Whether the peer is this host (a loopback address or a Unix socket), set by the
        # server: with no API keys, only such a peer may call the admin routes.
        self.loopback = False
        self._priority: Priority | None = None
        self._pinned = False  # a batch line's class, which its body cannot change

    # -- what the request owns -----------------------------------------------------------
    def admit(self, handle: ModelHandle) -> None:
        """Resolve the request's model and admit it at its :attr:`priority`
        (``Overloaded`` 429 raised here; a bad ``x-priority`` 400 before)."""
        assert self._ticket is None, "a request is admitted once"
        self._ticket = handle.admit(self.priority)
        self._handle = handle

    @property
    def priority(self) -> Priority:
        """The request's class (app/priorities.py): what its body asked for
        (:meth:`ask_priority`), else its ``x-priority`` header, else its API key's
        default; ``RequestError`` (400) if the header asks for a class it may not."""
        if self._priority is None:
            edge = self.edge
            key = edge.key if edge is not None else None
            self._priority = head_priority(self.header(PRIORITY_HEADER), key)
        return self._priority

    def ask_priority(self, asked: int | None, name: str = "priority") -> None:
        """The body's ``priority`` field (``None``: not given), which wins over the header;
        ``RequestError`` (400) naming ``name`` if its API key may not ask for it."""
        if self._pinned:
            return
        head = self.priority  # a malformed header is refused even when the body asks
        if asked is not None and asked != head:
            edge = self.edge
            self._priority = checked(asked, edge.key if edge is not None else None, name)

    def pin_priority(self, priority: Priority) -> None:
        """Fix the request's class whatever its body or headers ask: a batch line runs at
        the batch class (docs/architecture.md, "The Batch API")."""
        self._priority, self._pinned = priority, True

    @property
    def handle(self) -> ModelHandle:
        """The model the head hook resolved (a route without one has none: a bug)."""
        assert self._handle is not None, "the route's head hook resolves the model"
        return self._handle

    @property
    def has_ticket(self) -> bool:
        return self._ticket is not None

    def take_ticket(self) -> Ticket:
        """Hand the admission ticket on: the caller (the engine, a stream) now owns it."""
        ticket, self._ticket = self._ticket, None
        assert ticket is not None, "the ticket was already handed on (or never taken)"
        edge = self.edge
        if edge is not None and edge.trace is not None:  # its queue wait, traced
            ticket.watch = edge.trace.queue_watch()
        return ticket

    def store_body(self, store: BodyStore) -> None:
        """From the head hook: the body goes to ``store`` as it arrives; ``body`` stays
        empty. The request owns the store until its handler takes it."""
        assert self.body_store is None, "a body is stored once"
        self.body_store = store

    def take_body_store(self) -> BodyStore:
        """Hand the body's store on: the caller (the handler) owns it now."""
        store, self.body_store = self.body_store, None
        assert store is not None, "the body was not stored (or its store was taken)"
        return store

    def release(self, after_send: Callable[[Callable[[], None]], None] | None = None) -> None:
        """Return what the request still owns: a ticket no one took (the handler failed
        before using it) now, the body lease now or, given ``after_send`` (which schedules
        a callback), once the transport has sent the response (which may be a view of
        the body). Called once."""
        assert not self._released, "a request is released once"
        self._released = True
        ticket, self._ticket = self._ticket, None
        if ticket is not None:
            ticket.release()
        store, self.body_store = self.body_store, None
        if store is not None:
            store.discard()
        lease, self.lease = self.lease, None
        if lease is not None:
            if after_send is None:
                lease.release()
            else:
                after_send(lease.release)

    # -- the client ----------------------------------------------------------------------
    @property
    def disconnected(self) -> asyncio.Event:
        """Set when the client goes away (created on first use: most handlers never ask)."""
        if self._disconnected is None:
            self._disconnected = asyncio.Event()
        return self._disconnected

    def mark_disconnected(self) -> None:
        if self._disconnected is not None:
            self._disconnected.set()

    # -- the head ------------------------------------------------------------------------
    @property
    def method(self) -> str:
        return self.head.method

    @property
    def path(self) -> str:
        return self.head.path

    def header(self, name: bytes) -> bytes | None:
        """The first value of header ``name`` (lower-case bytes), or None."""
        return self.head.header(name)

    @property
    def query(self) -> dict[str, str]:
        if self._query is None:
            q = self.head.query
            self._query = dict(parse_qsl(q, keep_blank_values=True)) if q else {}
        return self._query

    def accepts(self, media_type: bytes) -> bool:
        accept = self.header(b"accept")
        return accept is not None and media_type in accept.lower()

    @property
    def content_type(self) -> bytes:
        ct = self.header(b"content-type")
        return ct.split(b";", 1)[0].strip().lower() if ct else b""
