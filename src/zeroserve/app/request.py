"""The request as the app layer sees it: a parsed head plus a zero-copy body view."""

from __future__ import annotations

import asyncio
from typing import Any
from urllib.parse import parse_qsl

from ..http.connection import RequestHead


class Request:
    """One HTTP request. ``body`` is a view of the buffer the body was received into
    (an arena lease for Content-Length bodies); it stays valid until the response has
    been sent. ``state`` carries what head-time hooks decided (model handle, ticket)."""

    __slots__ = ("_disconnected", "_query", "body", "head", "lease", "params", "route", "state")

    def __init__(self, head: RequestHead, params: dict[str, str], route: Any) -> None:
        self.head = head
        self.params = params
        self.route = route
        self.body: memoryview = memoryview(b"")
        self.lease: Any = None
        self.state: dict[str, Any] = {}
        self._disconnected: asyncio.Event | None = None
        self._query: dict[str, str] | None = None

    @property
    def disconnected(self) -> asyncio.Event:
        """Set when the client goes away (created on first use: most handlers never ask)."""
        if self._disconnected is None:
            self._disconnected = asyncio.Event()
        return self._disconnected

    def mark_disconnected(self) -> None:
        if self._disconnected is not None:
            self._disconnected.set()

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
