"""Response framing as lists of buffers for ``transport.writelines`` (never joined).

Strategy
--------
Status lines are precomputed; the Date header is rendered at most once a second (like
uvicorn and hyper's ``common/date.rs``). Bodies are never copied: a fixed body is its
own buffers after the head; a chunk is a size line, the pieces, and CRLF; an SSE event
is ``data: `` + piece + a blank line (split into one ``data:`` line per line of the
piece, so any payload keeps SSE framing). Several ready pieces share one chunk, so a
burst of events costs one size line and one ``writelines``.

The one exception is the small-piece gather (``GATHER_*``): a batch of many tiny pieces
(tokens) is joined into one buffer, because ``writev`` over hundreds of iovecs costs
more CPU than the copy. The copy is counted at site ``stream_gather``.

Which framing a response gets (Content-Length, chunked or close-delimited) is decided
by ``HttpConnection.start_response`` (docs/architecture.md, "HTTP/1.1: one connection,
both roles"); this module only renders it.
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterable, Sequence
from email.utils import formatdate
from http import HTTPStatus
from typing import Any

from .. import metrics

Buffer = bytes | bytearray | memoryview

_STATUS_LINES: dict[int, bytes] = {
    int(s): f"HTTP/1.1 {int(s)} {s.phrase}\r\n".encode("ascii") for s in HTTPStatus
}
CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"
LAST_CHUNK = b"0\r\n\r\n"
CRLF = b"\r\n"
SSE_DATA = b"data: "
SSE_END = b"\n\n"
_NL = b"\n"
_LINEBREAK = re.compile(rb"[\r\n]")

# A stream batch of more than 8 buffers averaging under 256 bytes each is joined into one
# buffer before the write: writev over hundreds of tiny iovecs costs more CPU than copying
# them (measured: 63 vs 157 CPU-us for the 768 buffers of a 256-event stream; see
# BENCHMARKS.md, W2). Payload-sized pieces are never joined.
GATHER_MIN_BUFFERS = 8
GATHER_MAX_BYTES = 256


def status_line(status: int) -> bytes:
    line = _STATUS_LINES.get(status)
    if line is None:
        line = _STATUS_LINES[status] = f"HTTP/1.1 {status} Unknown\r\n".encode("ascii")
    return line


class _DateCache:
    __slots__ = ("header", "second")

    def __init__(self) -> None:
        self.second = -1
        self.header = b""

    def get(self) -> bytes:
        now = int(time.time())
        if now != self.second:
            self.second = now
            self.header = b"date: " + formatdate(now, usegmt=True).encode("ascii") + CRLF
        return self.header


date_header = _DateCache().get


def encode_head(
    status: int,
    headers: Iterable[tuple[bytes, bytes]],
    *,
    content_length: int | None = None,
    chunked: bool = False,
    keep_alive: bool = True,
    date: bool = True,
) -> bytes:
    """Status line and header block. ``content_length`` None and ``chunked`` False means
    the body is delimited by closing the connection (HTTP/1.0 streaming). ``date`` False
    leaves the Date header out (for a response rendered once, ahead of time)."""
    parts = [status_line(status), date_header()] if date else [status_line(status)]
    for name, value in headers:
        parts += (name, b": ", value, CRLF)
    if content_length is not None:
        if status != 204:  # a 204 carries no Content-Length (RFC 9110, 8.6)
            parts += (b"content-length: ", str(content_length).encode("ascii"), CRLF)
    elif chunked:
        parts.append(b"transfer-encoding: chunked\r\n")
    if not keep_alive:
        parts.append(b"connection: close\r\n")
    parts.append(CRLF)
    return b"".join(parts)  # small: the head only, never payload


def refusal(status: int, headers: Iterable[tuple[bytes, bytes]], body: bytes) -> bytes:
    """A whole response that closes its connection, rendered once (no Date): the answer
    to a connection refused before any request is read (too many connections)."""
    return (
        encode_head(status, headers, content_length=len(body), keep_alive=False, date=False) + body
    )


def chunk(pieces: Sequence[Buffer], out: list[Buffer]) -> None:
    """Append one chunk holding ``pieces`` (concatenated on the wire) to ``out``."""
    size = 0
    for p in pieces:
        size += len(p) if not isinstance(p, memoryview) else p.nbytes
    if not size:
        return
    out.append(b"%x\r\n" % size)
    out.extend(pieces)
    out.append(CRLF)


_SSE_OVERHEAD = len(SSE_DATA) + len(SSE_END)


def sse_event(piece: Buffer, out: list[Buffer], size: int | None = None) -> int:
    """Append one SSE event carrying ``piece`` as its data to ``out`` (no copy); returns
    the event's size on the wire. ``size`` is ``piece``'s length if the caller knows it."""
    if _LINEBREAK.search(piece) is not None:
        lines = bytes(piece).splitlines() or [b""]  # rare: multi-line data is copied
        total = 1
        for line in lines:
            out += (SSE_DATA, line, _NL)
            total += len(SSE_DATA) + len(line) + 1
        out.append(_NL)
        return total
    out += (SSE_DATA, piece, SSE_END)
    if size is None:
        size = piece.nbytes if isinstance(piece, memoryview) else len(piece)
    return size + _SSE_OVERHEAD


def buffers_size(buffers: Iterable[Buffer]) -> int:
    n = 0
    for b in buffers:
        n += b.nbytes if isinstance(b, memoryview) else len(b)
    return n


class StreamFramer:
    """The body of one streamed response at a time, framed as its pieces arrive.

    ``begin`` takes the response head (sent with the first flush) and the framing
    decided by the connection; ``add`` frames ready pieces (SSE events or raw chunk data)
    onto the pending output; ``flush`` returns the buffers of one write: the pending
    output as one chunk (or as is, close-delimited), and the last chunk if ``last``.
    ``pieces`` and ``size`` (bytes before chunk framing) tell the writer when to flush.
    One framer per connection, reused by each of its streams.
    """

    __slots__ = ("chunked", "head", "out", "pieces", "size", "sse")

    def __init__(self) -> None:
        self.head: bytes | None = None
        self.out: list[Any] = []
        self.pieces = 0
        self.size = 0
        self.chunked = True
        self.sse = False

    def begin(self, head: bytes, *, chunked: bool, sse: bool) -> None:
        self.head = head
        self.out = []
        self.pieces = 0
        self.size = 0
        self.chunked = chunked
        self.sse = sse

    @property
    def pending(self) -> bool:
        return bool(self.out) or self.head is not None

    def add(self, pieces: list[Any]) -> None:
        """Frame ``pieces`` (bytes-like, ``str``, or lists of them) onto the output."""
        if self.sse and len(pieces) > GATHER_MIN_BUFFERS:
            # Short bytes pieces (tokens): frame them all with two C-level joins instead
            # of three buffers per event, and no Python code per piece. One copy, counted.
            # Pieces that are not all bytes-like (the join raises), payload-sized ones and
            # ones with line breaks (several data: lines) take the general path below.
            try:
                joined = b"".join(pieces)
            except TypeError:
                joined = None
            if joined is not None and self._gather(pieces, joined):
                return
        flat: list[Any] = []
        for piece in pieces:
            kind = type(piece)
            if kind is str:
                flat.append(piece.encode())
            elif kind is list:
                flat += [p.encode() if type(p) is str else p for p in piece]
            else:
                flat.append(piece)
        out = self.out
        if not self.sse:
            self.pieces += len(flat)
            for piece in flat:
                n = piece.nbytes if type(piece) is memoryview else len(piece)
                if n:
                    out.append(piece)
                    self.size += n
            return
        if len(flat) > GATHER_MIN_BUFFERS and self._gather(flat, b"".join(flat)):
            return
        self.pieces += len(flat)
        for piece in flat:
            n = piece.nbytes if type(piece) is memoryview else len(piece)
            self.size += sse_event(piece, out, n)

    def _gather(self, flat: list[Any], joined: bytes) -> bool:
        """Frame ``flat`` (bytes-like; ``joined`` is their concatenation) as SSE events
        in one buffer, if they are short and have no line breaks."""
        if len(joined) >= GATHER_MAX_BYTES * len(flat) or b"\n" in joined or b"\r" in joined:
            return False
        framed = b"data: " + b"\n\ndata: ".join(flat) + b"\n\n"
        metrics.count_copy("stream_gather", len(joined))
        self.out.append(framed)
        self.pieces += len(flat)
        self.size += len(framed)
        return True

    def add_event(self, data: bytes) -> None:
        """One SSE event (the final error event of a failed stream)."""
        self.size += sse_event(data, self.out)

    def flush(self, last: bool = False) -> list[Buffer]:
        """The buffers of the next write (empty if there is nothing to send)."""
        body, size = self.out, self.size
        self.out = []
        self.pieces = 0
        self.size = 0
        head, self.head = self.head, None
        buffers: list[Buffer] = [head] if head is not None else []
        if size:
            metrics.count_payload("out", size)
            if len(body) > GATHER_MIN_BUFFERS and size < GATHER_MAX_BYTES * len(body):
                # Many tiny buffers: one copy into a single buffer costs less CPU than a
                # writev over all of them. Counted, like every copy.
                body = [b"".join(body)]
                metrics.count_copy("stream_gather", size)
            if self.chunked:
                buffers.append(b"%x\r\n" % size)
                buffers += body
                buffers.append(CRLF)
            else:
                buffers += body
        if last and self.chunked:
            buffers.append(LAST_CHUNK)
        return buffers

    def discard(self) -> None:
        """Drop the pending output (the connection is gone)."""
        self.out = []
        self.pieces = 0
        self.size = 0
