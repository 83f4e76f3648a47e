"""HTTP/1.1 client role of one connection, without I/O: request heads out, response
heads and body bytes in (the gateway's side towards its upstreams), and the hop-by-hop
filtering of an intermediary (RFC 9110 §7.6.1).

Strategy
--------
The response head is collected until its blank line and handed to httptools'
``HttpResponseParser`` (llhttp) alone, as the server role does with requests. The body
framing (Content-Length, chunked, or until close; RFC 9112 §6.3) is decoded here, a
chunked body by the same ``ChunkedDecoder`` as the server role's (same rules, same
errors), and every body fragment is a ``memoryview`` slice of the ``bytes`` object the
transport received: no copy is made (httptools' ``on_body`` would hand a fresh ``bytes``
copy of each fragment), and the slice keeps that object alive for as long as a client
transport still holds it, so buffer lifetime needs no bookkeeping.

Invariants
----------
* ``feed`` returns body views in order; ``head`` is set before the first body view.
* The head is bounded by ``MAX_HEAD_BYTES``, chunk lines by ``MAX_CHUNK_LINE_BYTES`` and
  trailers by ``MAX_HEAD_BYTES``; anything malformed raises ``ProtocolError``. After
  ``done``, any further byte is an error (we never pipeline, so an upstream that sends
  more is broken).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

import httptools

from ..errors import ProtocolError
from .chunked import ChunkedDecoder

# Largest upstream response head (and its chunked trailers). Servers cap theirs at
# 8-64 KiB (nginx 8 KiB, Node 16 KiB); 64 KiB accepts any honest upstream and bounds a
# broken one.
MAX_HEAD_BYTES = 64 * 1024

# RFC 9110 §7.6.1 hop-by-hop fields, plus what the relay sets itself on each side.
HOP_BY_HOP = frozenset(
    (
        b"connection",
        b"keep-alive",
        b"transfer-encoding",
        b"te",
        b"trailer",
        b"upgrade",
        b"proxy-connection",
        b"proxy-authenticate",
        b"proxy-authorization",
    )
)
# Response fields the server computes for the client (framing and date).
_RESPONSE_DROP = HOP_BY_HOP | {b"content-length", b"date"}
# Request fields the relay sets itself for the upstream.
_REQUEST_DROP = HOP_BY_HOP | {b"host", b"content-length", b"expect"}

Headers = list[tuple[bytes, bytes]]


class Framing(enum.Enum):
    NONE = "none"
    LENGTH = "length"
    CHUNKED = "chunked"
    CLOSE = "close"  # delimited by the connection closing


@dataclass(slots=True)
class ResponseHead:
    status: int
    headers: Headers  # names lower-cased, values as received
    framing: Framing
    content_length: int | None
    keep_alive: bool

    def header(self, name: bytes) -> bytes | None:
        for k, v in self.headers:
            if k == name:
                return v
        return None


class _HeaderCollector:
    __slots__ = ("headers",)

    def __init__(self) -> None:
        self.headers: Headers = []

    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers.append((name.lower(), value))


class _S(enum.Enum):
    HEAD = 0
    LENGTH = 1
    CHUNKED = 2
    CLOSE = 3
    DONE = 4


class ResponseReader:
    """Decodes one response at a time. ``start(method)`` before each response."""

    __slots__ = ("_chunked", "_head_buf", "_left", "_no_body", "_state", "head", "received")

    def __init__(self) -> None:
        self.head: ResponseHead | None = None
        self.received = 0  # bytes of this response seen so far (head included)
        self._state = _S.DONE
        self._head_buf = bytearray()
        self._chunked = ChunkedDecoder(max_body=None, max_trailer_bytes=MAX_HEAD_BYTES)
        self._left = 0
        self._no_body = False

    def start(self, method: str) -> None:
        self.head = None
        self.received = 0
        self._state = _S.HEAD
        self._head_buf.clear()
        self._chunked.reset()
        self._no_body = method == "HEAD"

    @property
    def done(self) -> bool:
        return self._state is _S.DONE

    def feed(self, data: bytes) -> list[memoryview]:
        """Consume received bytes; return the body fragments they hold (views of ``data``)."""
        if self._state is _S.DONE:
            raise ProtocolError("bytes received outside a response")
        if not isinstance(data, bytes):
            data = bytes(data)  # transports hand over bytes; this is for tests
        self.received += len(data)
        view = memoryview(data)
        out: list[memoryview] = []
        pos = 0
        end = len(view)
        while pos < end:
            state = self._state
            if state is _S.HEAD:
                pos = self._feed_head(view, pos)
            elif state is _S.CHUNKED:
                chunked = self._chunked
                pos = chunked.feed(data, view, pos, end, out.append)
                if chunked.done:
                    self._state = _S.DONE
            elif state is _S.LENGTH:
                n = min(self._left, end - pos)
                out.append(view[pos : pos + n])
                pos += n
                self._left -= n
                if not self._left:
                    self._state = _S.DONE
            elif state is _S.CLOSE:
                out.append(view[pos:])
                pos = end
            else:
                raise ProtocolError("bytes received after the end of the response")
        return out

    def feed_eof(self) -> bool:
        """The connection closed. True if that ended the response properly."""
        if self._state is _S.CLOSE:
            self._state = _S.DONE
            return True
        return self._state is _S.DONE

    # -- head -------------------------------------------------------------------------------
    def _feed_head(self, view: memoryview, pos: int) -> int:
        buf = self._head_buf
        if not buf:
            # Fast path: the whole head arrived in this read (nearly always).
            data = view.obj
            if isinstance(data, bytes) and pos == 0:
                idx = data.find(b"\r\n\r\n", 0, MAX_HEAD_BYTES)
                if idx >= 0:
                    return self._head_done(data[: idx + 4], idx + 4)
        scan = max(0, len(buf) - 3)
        room = MAX_HEAD_BYTES - len(buf)
        take = view[pos : pos + room]
        buf += take
        idx = buf.find(b"\r\n\r\n", scan)
        if idx < 0:
            if len(buf) >= MAX_HEAD_BYTES:
                raise ProtocolError(f"response head over {MAX_HEAD_BYTES} bytes")
            return pos + len(take)
        head_len = idx + 4
        consumed = pos + len(take) - (len(buf) - head_len)
        del buf[head_len:]
        raw = bytes(buf)
        buf.clear()
        return self._head_done(raw, consumed)

    def _head_done(self, raw: bytes, consumed: int) -> int:
        head = self._parse_head(raw)
        if 100 <= head.status < 200:
            # 1xx informational (we never send Expect, but 103 Early Hints exists): skip.
            return consumed
        self.head = head
        if head.framing is Framing.NONE or (head.framing is Framing.LENGTH and not self._left):
            self._state = _S.DONE
        elif head.framing is Framing.LENGTH:
            self._state = _S.LENGTH
        elif head.framing is Framing.CHUNKED:
            self._state = _S.CHUNKED
        else:
            self._state = _S.CLOSE
        return consumed

    def _parse_head(self, raw: bytes) -> ResponseHead:
        c = _HeaderCollector()
        parser = httptools.HttpResponseParser(c)
        try:
            parser.feed_data(raw)
        except httptools.HttpParserError as exc:
            raise ProtocolError(f"malformed response head: {exc}") from None
        status = parser.get_status_code()
        # Decided here, not by llhttp's should_keep_alive(), which reads state that a
        # message completed by its head alone (content-length: 0) has already reset.
        tokens: set[bytes] = set()
        length: int | None = None
        chunked = te = False
        for name, value in c.headers:
            if name == b"connection":
                tokens.update(t.strip().lower() for t in value.split(b","))
            elif name == b"content-length":
                if length is not None or not value.strip().isdigit():
                    raise ProtocolError("invalid or repeated content-length")
                length = int(value)
            elif name == b"transfer-encoding":
                codings = [v.strip().lower() for v in value.split(b",")]
                chunked, te = codings[-1] == b"chunked", True
        keep_alive = b"close" not in tokens and (
            parser.get_http_version() == "1.1" or b"keep-alive" in tokens
        )
        if self._no_body or status in (204, 304) or 100 <= status < 200:
            framing = Framing.NONE
        elif chunked:
            framing, length = Framing.CHUNKED, None
        elif te:  # a transfer coding other than chunked: the body runs until close
            framing, length = Framing.CLOSE, None
            keep_alive = False
        elif length is not None:
            framing = Framing.LENGTH
            self._left = length
        else:
            framing = Framing.CLOSE
            keep_alive = False
        return ResponseHead(status, c.headers, framing, length, keep_alive)


def request_head(
    method: str,
    target: str,
    authority: str,
    content_length: int,
    headers: Headers,
    extra: Headers,
) -> bytes:
    """The head of an upstream request. ``headers`` are the client's (filtered here),
    ``extra`` the relay's own (e.g. authorization)."""
    parts = [
        f"{method} {target} HTTP/1.1\r\nhost: {authority}\r\ncontent-length: {content_length}\r\n".encode(
            "latin-1"
        )
    ]
    skip = _REQUEST_DROP | {name for name, _ in extra}
    for name, value in headers:
        if name not in skip:
            parts += (name, b": ", value, b"\r\n")
    for name, value in extra:
        parts += (name, b": ", value, b"\r\n")
    parts.append(b"\r\n")
    return b"".join(parts)  # the head only: small, never payload


def response_headers(head: ResponseHead) -> tuple[Headers, bytes | None]:
    """The upstream's end-to-end headers for the client, and its content type apart (the
    server's response types add that one themselves). Fields the upstream's
    ``Connection`` header names are hop-by-hop too (RFC 9110 §7.6.1)."""
    drop = _RESPONSE_DROP
    conn = head.header(b"connection")
    if conn:
        drop = drop | {t.strip().lower() for t in conn.split(b",")}
    out: Headers = []
    content_type = None
    for name, value in head.headers:
        if name == b"content-type":
            content_type = value
        elif name not in drop:
            out.append((name, value))
    return out, content_type
