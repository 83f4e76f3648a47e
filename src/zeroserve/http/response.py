"""Response framing as lists of buffers for ``transport.writelines`` (never joined).

Status lines are precomputed; the Date header is rendered at most once a second (like
uvicorn and hyper's ``common/date.rs``). Bodies are never copied: a fixed body is its
own buffers after the head; a chunk is a size line, the pieces, and CRLF; an SSE event
is ``data: `` + piece + a blank line (split into one ``data:`` line per line of the
piece, so any payload keeps SSE framing). Several ready pieces share one chunk, so a
burst of events costs one size line and one ``writelines``.
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterable, Sequence
from email.utils import formatdate
from http import HTTPStatus

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
) -> bytes:
    """Status line and header block. ``content_length`` None and ``chunked`` False means
    the body is delimited by closing the connection (HTTP/1.0 streaming)."""
    parts = [status_line(status), date_header()]
    for name, value in headers:
        parts += (name, b": ", value, CRLF)
    if content_length is not None:
        parts += (b"content-length: ", str(content_length).encode("ascii"), CRLF)
    elif chunked:
        parts.append(b"transfer-encoding: chunked\r\n")
    if not keep_alive:
        parts.append(b"connection: close\r\n")
    parts.append(CRLF)
    return b"".join(parts)  # small: the head only, never payload


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
