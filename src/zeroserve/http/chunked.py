"""The chunked transfer coding (RFC 9112 §7.1), decoded for both roles.

Strategy
--------
One decoder serves the server role (a request body, read from the connection's head
buffer and copied into a sink) and the client role (a response body, read from the
``bytes`` a transport handed over and passed on as views of them, with no copy). It
consumes every byte it is given up to the end of the body: a size or trailer line split
across reads is kept in a small line buffer of its own, so the caller never has to keep
partial lines. Data is passed to ``emit`` as slices of the view it was fed.

Invariants
----------
* Lines end in CRLF; a bare LF is refused (RFC 9112 §2.2 lets a recipient reject it).
* A size is 1-16 hex digits (up to 2**64 - 1), then optional extensions after ``;``
  (ignored). Chunk data is followed by exactly CRLF.
* A size or trailer line is at most ``MAX_CHUNK_LINE_BYTES``; trailers (skipped) are at
  most ``max_trailer_bytes`` in all (431); the decoded body at most ``max_body`` (413).
* Every violation raises ``ProtocolError`` with the status a server answers; a client
  treats any of them as a broken upstream.
"""

from __future__ import annotations

from collections.abc import Callable

from ..errors import ProtocolError
from .limits import MAX_CHUNK_LINE_BYTES

__all__ = ["ChunkedDecoder"]

_HEX = frozenset(b"0123456789abcdefABCDEF")
_MAX_CHUNK_SIZE_DIGITS = 16  # 2**64 - 1; anything longer is an overflow attempt

_SIZE, _DATA, _DATA_CR, _DATA_LF, _TRAILERS, _DONE = range(6)


class ChunkedDecoder:
    """Decodes one chunked body at a time; ``reset()`` before each body."""

    __slots__ = (
        "_left",
        "_line",
        "_phase",
        "_trailer_bytes",
        "max_body",
        "max_trailer_bytes",
        "total",
    )

    def __init__(self, *, max_body: int | None, max_trailer_bytes: int) -> None:
        self.max_body = max_body
        self.max_trailer_bytes = max_trailer_bytes
        self._line = bytearray()
        self.reset()

    def reset(self) -> None:
        self._phase = _SIZE
        self._left = 0
        self._trailer_bytes = 0
        self._line.clear()
        self.total = 0  # decoded body bytes so far

    @property
    def done(self) -> bool:
        return self._phase == _DONE

    def feed(
        self,
        data: bytes | bytearray,
        view: memoryview,
        pos: int,
        end: int,
        emit: Callable[[memoryview], object],
    ) -> int:
        """Decode ``data[pos:end]`` (``view`` is a memoryview of ``data``); body bytes go
        to ``emit`` as slices of ``view``. Returns where decoding stopped: ``end``, or
        the first byte after the body once it is ``done``."""
        while pos < end:
            phase = self._phase
            if phase == _DATA:
                take = min(self._left, end - pos)
                emit(view[pos : pos + take])
                pos += take
                self._left -= take
                if not self._left:
                    self._phase = _DATA_CR
            elif phase in (_DATA_CR, _DATA_LF):
                if data[pos] != (13 if phase == _DATA_CR else 10):
                    raise ProtocolError("missing CRLF after chunk data")
                pos += 1
                self._phase = _DATA_LF if phase == _DATA_CR else _SIZE
            elif phase == _DONE:
                return pos
            else:
                pos = self._feed_line(data, view, pos, end)
        return pos

    def _feed_line(self, data: bytes | bytearray, view: memoryview, pos: int, end: int) -> int:
        pending = self._line
        limit = MAX_CHUNK_LINE_BYTES - len(pending)
        nl = data.find(b"\n", pos, min(end, pos + limit + 1))
        if nl < 0:
            if end - pos > limit:
                self._too_long()
            pending += view[pos:end]
            return end
        line: bytes | bytearray
        if pending:
            pending += view[pos:nl]
            line = bytes(pending)
            pending.clear()
        else:
            line = data[pos:nl]
        if not line or line[-1] != 13:
            raise ProtocolError("bare LF in chunked framing")
        line = line[:-1]
        pos = nl + 1
        if self._phase == _TRAILERS:  # skipped, bounded in all
            if not line:
                self._phase = _DONE
                return pos
            self._trailer_bytes += len(line) + 2
            if self._trailer_bytes > self.max_trailer_bytes:
                raise ProtocolError("chunked trailers too large", status=431)
            return pos
        size_field = line.split(b";", 1)[0].rstrip(b" \t")
        if (
            not size_field
            or len(size_field) > _MAX_CHUNK_SIZE_DIGITS
            or not _HEX.issuperset(size_field)
        ):
            raise ProtocolError("invalid chunk size")
        size = int(size_field, 16)
        if size == 0:
            self._phase = _TRAILERS
            return pos
        self.total += size
        if self.max_body is not None and self.total > self.max_body:
            raise ProtocolError(
                f"chunked body exceeds the limit of {self.max_body} bytes", status=413
            )
        self._left = size
        self._phase = _DATA
        return pos

    def _too_long(self) -> None:
        if self._phase == _TRAILERS:
            raise ProtocolError("chunked trailer line too long", status=431)
        raise ProtocolError("chunk line too long")
