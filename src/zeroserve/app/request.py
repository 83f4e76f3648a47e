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

    __slots__ = ("_query", "body", "disconnected", "head", "lease", "params", "route", "state")

    def __init__(self, head: RequestHead, params: dict[str, str], route: Any) -> None:
        self.head = head
        self.params = params
        self.route = route
        self.body: memoryview = memoryview(b"")
        self.lease: Any = None
        self.state: dict[str, Any] = {}
        self.disconnected = asyncio.Event()
        self._query: dict[str, str] | None = None

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
            self._query = dict(parse_qsl(self.head.query, keep_blank_values=True))
        return self._query

    def accepts(self, media_type: bytes) -> bool:
        accept = self.header(b"accept")
        return accept is not None and media_type in accept.lower()

    @property
    def content_type(self) -> bytes:
        ct = self.header(b"content-type")
        return ct.split(b";", 1)[0].strip().lower() if ct else b""
