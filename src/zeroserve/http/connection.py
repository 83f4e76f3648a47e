"""HTTP/1.1 server side of one connection, both directions, without I/O (sans-I/O).

Everything that decides what the next byte in or out of a server connection means is
here (docs/architecture.md, "HTTP/1.1: one connection, both roles"); one head is parsed
and validated by ``request.py``, a chunked body decoded by ``chunked.py``.

Strategy
--------
The I/O layer asks ``next_buffer()`` where to ``recv_into`` and reports the byte count
with ``buffer_updated(n)``. Heads are read into a small per-connection buffer whose
receive window starts at ``head_window_bytes`` and doubles while no blank line is found,
so body bytes that arrive with the head (and must be copied into the body buffer) stay
a small share of the body. Only the head, through its blank line, is fed to httptools
(llhttp) by ``request.parse_head``: the body is ours to place.

A Content-Length body is received straight into the view the I/O layer passes to
``receive_into()`` (an arena lease of exactly that size), so no user-space copy takes
place apart from the head-overflow bytes; or, through ``receive_streamed()``, into a
smaller window handed to a ``BodySink`` each time it fills (a body stored as it
arrives). A chunked body is decoded here from the head
buffer (used as scratch) by the ``ChunkedDecoder`` both roles share into the
``BodySink`` the I/O layer passes to ``receive_chunked()``: one copy, which the sink
counts.

The response side renders heads and decides framing: ``start_response()`` picks
Content-Length, chunked (HTTP/1.1 streams) or close-delimited (HTTP/1.0 streams), drops
the body of a HEAD answer (``body_allowed``) and adds ``connection: close`` when the
connection will not be reused; ``continue_line()`` is the 100-continue interim answer;
``end_response(draining=...)`` decides keep-alive, once, from the request, the
response's framing, the client's EOF and the server's drain. An answer given before the
body was read (404, 429, ...) leaves a small Content-Length body to be read and dropped
in the ``DISCARD`` state, so the connection stays usable; any other unread body closes
it. ``reject()`` answers a protocol error and closes.

Invariants
----------
* One request at a time: after a request's body is complete the connection is in
  ``HANDLING`` and bytes that arrive (pipelined requests, or EOF) are buffered, never
  parsed, until ``end_response()``. Responses therefore leave in request order.
* Every limit is checked before the bytes it guards are stored: the head against
  ``max_head_bytes`` (431) and ``max_uri_bytes`` (414) while it is still incomplete, the
  Content-Length against ``max_body_bytes`` (413) before any body byte is read.
* No request is processed with an ambiguous length (RFC 9112 §6.3, checked by
  ``request.py``): such a request is 400 and closes the connection.
* Keep-alive is decided only by ``end_response()``: a response is followed by another
  request only if the request allowed it (HTTP/1.1 without ``Connection: close``, or
  HTTP/1.0 with ``Connection: keep-alive``), its body was framed by length or chunks,
  its request body was read (or is being discarded), the client did not half-close, and
  the server is not draining.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Protocol

from ..errors import ProtocolError
from .chunked import ChunkedDecoder
from .framing import CONTINUE, encode_head
from .limits import DISCARD_MAX_BYTES, HttpLimits
from .request import HeadCollector, RequestHead, parse_head

__all__ = ["BodyComplete", "BodySink", "HttpConnection", "RequestHead", "State"]


class State(enum.Enum):
    HEAD = "head"  # waiting for (more of) a request head
    BODY = "body"  # receiving a Content-Length body into the given view
    STREAMED = "streamed"  # receiving a Content-Length body through a window into a sink
    CHUNKED = "chunked"  # decoding a chunked body into the sink
    AWAIT_BODY = "await_body"  # head parsed; the I/O layer must call receive_*()
    HANDLING = "handling"  # request complete; waiting for end_response()
    DISCARD = "discard"  # answered early; reading and dropping the request's body
    CLOSED = "closed"


class BodySink(Protocol):
    """Where a chunked body is decoded to, or a streamed one written to (``receive_streamed``).
    ``write`` consumes ``data`` (a transient view) before it returns."""

    def write(self, data: memoryview) -> None: ...


@dataclass(slots=True, frozen=True)
class BodyComplete:
    size: int


class HttpConnection:
    """The state machine of one HTTP/1.1 server connection: requests in, responses out."""

    def __init__(self, limits: HttpLimits | None = None) -> None:
        self.limits = limits or HttpLimits()
        self._buf = bytearray(self.limits.max_head_bytes)
        self._mv = memoryview(self._buf)
        self._start = 0  # first unconsumed byte in _buf
        self._end = 0  # end of received bytes in _buf
        self._scan = 0  # where the search for the blank line resumes
        self._window = self.limits.head_window_bytes
        self._collector = HeadCollector(self.limits.max_headers)
        self.state = State.HEAD
        self.head: RequestHead | None = None
        self._body: memoryview | None = None
        self._body_pos = 0
        self._sink: BodySink | None = None
        self._stream_left = 0  # body bytes still to receive in STREAMED
        self._chunked = ChunkedDecoder(
            max_body=self.limits.max_body_bytes, max_trailer_bytes=self.limits.max_head_bytes
        )
        self._discard_left = 0  # body bytes still to drop in DISCARD
        self.overflow_copied = 0  # body bytes copied from the head buffer (accounting)
        self.eof = False  # the client half-closed: no request follows this one
        # The response being sent (set by start_response):
        self.body_allowed = True  # False for the answer to HEAD: the head only
        self.chunked_out = False  # a streamed body is chunked (else close-delimited)
        self._reusable = False  # keep-alive as far as the request and framing allow
        self._continue_sent = False

    # -- what the I/O layer asks ----------------------------------------------------------
    def next_buffer(self) -> memoryview:
        """The writable view the next ``recv_into`` must fill (never empty while reading)."""
        if self.state is State.BODY:
            assert self._body is not None
            return self._body[self._body_pos :]
        if self.state is State.STREAMED:
            # Never past the body's end: the next request's bytes go to the head buffer.
            assert self._body is not None
            pos = self._body_pos
            return self._body[pos : min(len(self._body), pos + self._stream_left)]
        if self._start and self._start == self._end:
            self._start = self._end = self._scan = 0
        elif self._start and self.state is not State.HANDLING:
            # Move the pending bytes (a partial head or chunk line) to the front. Small:
            # bounded by the head limit, and usually zero bytes.
            n = self._end - self._start
            self._buf[0:n] = self._mv[self._start : self._end]
            self._scan = max(0, self._scan - self._start)
            self._start, self._end = 0, n
        if self.state is State.HEAD:
            stop = min(len(self._buf), self._start + self._window)
            if stop <= self._end:
                stop = len(self._buf)
            return self._mv[self._end : stop]
        return self._mv[self._end :]

    @property
    def unread_room(self) -> int:
        """Bytes of the head buffer after the received ones: 0 when it is full (see
        ``reading_blocked``)."""
        return len(self._buf) - self._end

    @property
    def reading_blocked(self) -> bool:
        """True when the I/O layer must pause reading (no room until a response ends)."""
        return self.state in (State.HANDLING, State.AWAIT_BODY) and self._end >= len(self._buf)

    @property
    def idle(self) -> bool:
        """Between requests with nothing buffered (safe to close for keep-alive/drain)."""
        return self.state is State.HEAD and self._start == self._end

    @property
    def buffered(self) -> int:
        return self._end - self._start

    def buffer_updated(self, nbytes: int) -> RequestHead | BodyComplete | None:
        """``nbytes`` were received into the last ``next_buffer()``. Returns the event it
        completes, if any. Raises ``ProtocolError`` with the status to answer."""
        state = self.state
        if state is State.BODY:
            self._body_pos += nbytes
            assert self._body is not None
            if self._body_pos >= len(self._body):
                self.state = State.HANDLING
                return BodyComplete(self._body_pos)
            return None
        if state is State.STREAMED:
            return self._streamed(nbytes)
        if state is State.CLOSED:
            return None
        self._end += nbytes
        if state is State.HEAD:
            return self._parse_head()
        if state is State.CHUNKED:
            return self._decode_chunked()
        if state is State.DISCARD:
            return self._discard()
        return None  # HANDLING / AWAIT_BODY: keep the bytes for later

    def receive_into(self, body: memoryview) -> BodyComplete | None:
        """Receive the current request's Content-Length body into ``body`` (exact size).
        Body bytes already read with the head are copied in first (counted)."""
        if self.state is not State.AWAIT_BODY or self.head is None or self.head.chunked:
            raise RuntimeError("receive_into() without a Content-Length body pending")
        if len(body) != self.head.content_length:
            raise ValueError("body buffer must be exactly Content-Length bytes")
        take = min(len(body), self._end - self._start)
        if take:
            body[:take] = self._mv[self._start : self._start + take]
            self._start += take
            self.overflow_copied += take
        self._body = body
        self._body_pos = take
        if take == len(body):
            self.state = State.HANDLING
            return BodyComplete(take)
        self.state = State.BODY
        return None

    def receive_streamed(self, sink: BodySink, window: memoryview) -> BodyComplete | None:
        """Receive the current request's Content-Length body through ``window`` into
        ``sink``: each time the window fills, and at the body's end, ``sink.write`` gets
        the received part of it (a body stored as it arrives, such as an upload written
        to disk, is never whole in memory). Body bytes read with the head go to the sink
        first, as views of the head buffer."""
        head = self.head
        if self.state is not State.AWAIT_BODY or head is None or head.chunked:
            raise RuntimeError("receive_streamed() without a Content-Length body pending")
        if not window:
            raise ValueError("the window must not be empty")
        total = head.content_length or 0
        take = min(total, self._end - self._start)
        if take:
            sink.write(self._mv[self._start : self._start + take])
            self._start += take
        self._sink = sink
        self._body = window
        self._body_pos = 0
        self._stream_left = total - take
        if not self._stream_left:
            self.state = State.HANDLING
            return BodyComplete(total)
        self.state = State.STREAMED
        return None

    def _streamed(self, nbytes: int) -> BodyComplete | None:
        body, sink = self._body, self._sink
        assert body is not None and sink is not None and self.head is not None
        self._body_pos += nbytes
        self._stream_left -= nbytes
        if self._body_pos == len(body) or not self._stream_left:
            sink.write(body[: self._body_pos])
            self._body_pos = 0
        if self._stream_left:
            return None
        self.state = State.HANDLING
        return BodyComplete(self.head.content_length or 0)

    def receive_chunked(self, sink: BodySink) -> BodyComplete | None:
        """Decode the current request's chunked body into ``sink``."""
        if self.state is not State.AWAIT_BODY or self.head is None or not self.head.chunked:
            raise RuntimeError("receive_chunked() without a chunked body pending")
        self._sink = sink
        self._chunked.reset()
        self.state = State.CHUNKED
        return self._decode_chunked()

    # -- response side --------------------------------------------------------------------
    def continue_line(self) -> bytes | None:
        """The ``100 Continue`` interim response to send before reading the body, if the
        request asked for one (once per request)."""
        head = self.head
        if (
            head is None
            or not head.expect_continue
            or self._continue_sent
            or self.state is not State.AWAIT_BODY
        ):
            return None
        self._continue_sent = True
        return CONTINUE

    def start_response(
        self,
        status: int,
        headers: Iterable[tuple[bytes, bytes]],
        *,
        content_length: int | None,
        draining: bool,
    ) -> bytes:
        """The head of the response to the current request. ``content_length`` None is a
        streamed body: chunked on HTTP/1.1, delimited by closing on HTTP/1.0. Sets
        ``body_allowed`` (False for HEAD) and ``chunked_out``. Called in ``HANDLING``, or
        in ``AWAIT_BODY`` for an answer given before the body was read (which is then
        discarded by ``end_response`` if small enough, else the connection closes)."""
        head = self.head
        if head is None or self.state not in (State.HANDLING, State.AWAIT_BODY):
            raise RuntimeError("start_response() without a request to answer")
        reusable = head.keep_alive and not draining and not self.eof
        chunked = False
        if content_length is None:
            chunked = head.version == "1.1"
            reusable = reusable and chunked
        if self.state is State.AWAIT_BODY:  # an early answer: can the body be skipped?
            cl = head.content_length
            reusable = reusable and (
                not head.chunked
                and cl is not None
                and cl <= DISCARD_MAX_BYTES
                and not head.expect_continue
                and status != 413
            )
        self._reusable = reusable
        self.chunked_out = chunked
        self.body_allowed = head.method != "HEAD"
        return encode_head(
            status, headers, content_length=content_length, chunked=chunked, keep_alive=reusable
        )

    def end_response(self, *, draining: bool) -> RequestHead | None:
        """The response to the current request has been handed to the transport. Decides
        keep-alive: afterwards ``state`` is ``CLOSED`` (the I/O layer closes the
        transport once what is queued is sent), ``DISCARD`` (an early answer's body is
        being dropped), or ``HEAD``; returns the next pipelined head if one is already
        buffered (or ``None``). Raises ``ProtocolError`` for a bad pipelined head."""
        keep = self._reusable and not draining and not self.eof and self.state is not State.CLOSED
        head = self.head
        unread = (
            (head.content_length or 0) if head is not None and self.state is State.AWAIT_BODY else 0
        )
        self.head = None
        self._body = None
        self._sink = None
        self._reusable = False
        self._continue_sent = False
        if not keep:
            self.state = State.CLOSED
            return None
        if unread:
            take = min(unread, self._end - self._start)
            self._start += take
            self._discard_left = unread - take
            if self._discard_left:
                self.state = State.DISCARD
                return None
        return self._next_request()

    def reject(
        self, status: int, headers: Iterable[tuple[bytes, bytes]], content_length: int
    ) -> bytes:
        """The head of the answer to a protocol error. The connection closes after it:
        the framing of what follows can no longer be trusted (RFC 9112 §6.3)."""
        self.state = State.CLOSED
        self.body_allowed = True
        return encode_head(status, headers, content_length=content_length, keep_alive=False)

    def close(self) -> None:
        """The connection is closed (by either side, or cut off mid-response)."""
        self.state = State.CLOSED

    def _next_request(self) -> RequestHead | None:
        self.state = State.HEAD
        self._window = self.limits.head_window_bytes
        self._scan = self._start
        if self._end > self._start:
            return self._parse_head()
        return None

    def _discard(self) -> RequestHead | None:
        take = min(self._discard_left, self._end - self._start)
        self._start += take
        self._discard_left -= take
        if self._discard_left:
            return None
        return self._next_request()

    # -- head ---------------------------------------------------------------------------
    def _parse_head(self) -> RequestHead | None:
        buf, limits = self._buf, self.limits
        # RFC 9112 §2.2: ignore empty lines received before a request line.
        while (
            self._end - self._start >= 2 and buf[self._start] == 13 and buf[self._start + 1] == 10
        ):
            self._start += 2
        if self._scan < self._start:
            self._scan = self._start
        idx = buf.find(b"\r\n\r\n", self._scan, self._end)
        if idx < 0:
            pending = self._end - self._start
            # Bare LF line endings never complete a head: refuse them now rather than
            # waiting for a timeout (RFC 9112 §2.2 lets us reject them).
            lf = buf.find(b"\n", self._start, self._end)
            if lf >= 0 and (lf == self._start or buf[lf - 1] != 13):
                raise ProtocolError("bare LF in request head")
            if buf.find(b"\n\n", self._start, self._end) >= 0:
                raise ProtocolError("bare LF in request head")
            if (
                buf.find(b"\r\n", self._start, self._end) < 0
                and pending > limits.max_uri_bytes + 32
            ):
                raise ProtocolError("request URI too long", status=414)
            if pending >= limits.max_head_bytes:
                raise ProtocolError("request head too large", status=431)
            self._scan = max(self._start, self._end - 3)
            if pending >= self._window:
                self._window = min(self._window * 2, limits.max_head_bytes)
            return None
        head_end = idx + 4
        line_end = buf.find(b"\r\n", self._start, head_end)
        if line_end - self._start > limits.max_uri_bytes + 32:
            raise ProtocolError("request URI too long", status=414)
        # The version ends the request line: read here from the bytes, so the parser's
        # get_http_version() (a str formatted per call) is asked only for anything else.
        if buf.endswith(b" HTTP/1.1", self._start, line_end):
            version = "1.1"
        elif buf.endswith(b" HTTP/1.0", self._start, line_end):
            version = "1.0"
        else:
            version = ""
        head = parse_head(self._mv[self._start : head_end], self._collector, limits, version)
        self._start = self._scan = head_end
        self.head = head
        if head.has_body:
            self.state = State.AWAIT_BODY
        else:
            self.state = State.HANDLING
        return head

    # -- chunked body -------------------------------------------------------------------
    def _decode_chunked(self) -> BodyComplete | None:
        sink = self._sink
        assert sink is not None
        dec = self._chunked
        self._start = dec.feed(self._buf, self._mv, self._start, self._end, sink.write)
        if dec.done:
            self.state = State.HANDLING
            return BodyComplete(dec.total)
        return None
