"""One keep-alive HTTP/1.1 client connection on asyncio streams, for the load generator.

Strategy: the request is bytes built once per run; the response head is read up to
``\\r\\n\\r\\n`` and its body framed by ``Transfer-Encoding: chunked``, ``Content-Length``
or the end of the connection, as RFC 9112 §6.3 orders them. Every body piece is handed to
the caller with its arrival time (``time.perf_counter``), so time to first token and the
gaps between tokens are measured where the bytes arrive. Invariants: a response is read
to its end before the next request is sent on the connection; a connection the server
asked to close, or one left mid-response (timeout, error), is closed and reopened.
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
import time
from collections.abc import Callable
from dataclasses import dataclass

# Longest response head accepted (status line and headers); a server sending more is
# broken for this purpose. 64 KiB is httptools'/nginx's order of magnitude.
MAX_HEAD_BYTES = 64 * 1024
# Read size for close-delimited bodies.
READ_BYTES = 64 * 1024


class MalformedResponse(Exception):
    """The server's answer is not HTTP/1.1 this client can frame."""


@dataclass(frozen=True)
class Target:
    host: str
    port: int
    tls: bool


@dataclass
class Answered:
    status: int
    headers: dict[str, str]  # lower-cased names; repeated names joined with ", "
    body_bytes: int
    keep_alive: bool


OnPiece = Callable[[bytes, float], None]


def _parse_head(head: bytes) -> tuple[int, dict[str, str]]:
    lines = head.decode("latin-1").split("\r\n")
    parts = lines[0].split(" ", 2)
    if len(parts) < 2 or not parts[0].startswith("HTTP/1.") or not parts[1].isdigit():
        raise MalformedResponse(f"bad status line {lines[0][:80]!r}")
    headers: dict[str, str] = {}
    for line in lines[1:]:
        if not line:
            continue
        name, sep, value = line.partition(":")
        if not sep:
            raise MalformedResponse(f"bad header line {line[:80]!r}")
        key = name.strip().lower()
        headers[key] = f"{headers[key]}, {value.strip()}" if key in headers else value.strip()
    return int(parts[1]), headers


class Connection:
    """One connection to ``target``, opened on first use and reopened when needed."""

    def __init__(self, target: Target) -> None:
        self._target = target
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None

    async def _open(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        if self._reader is None or self._writer is None or self._writer.is_closing():
            context = ssl.create_default_context() if self._target.tls else None
            self._reader, self._writer = await asyncio.open_connection(
                self._target.host, self._target.port, ssl=context, limit=MAX_HEAD_BYTES
            )
        return self._reader, self._writer

    async def request(self, raw: bytes, on_piece: OnPiece) -> Answered:
        """Send ``raw`` (a whole request) and read the whole answer. On any exception the
        connection is closed (it may be mid-response). A kept-alive connection the server
        closed while idle fails before any byte of the answer: that request is sent once
        more on a fresh connection."""
        try:
            reused = self._writer is not None and not self._writer.is_closing()
            reader, writer = await self._open()
            writer.write(raw)
            try:
                head = await reader.readuntil(b"\r\n\r\n")
            except asyncio.LimitOverrunError as exc:
                raise MalformedResponse("response head too large") from exc
            except (ConnectionError, asyncio.IncompleteReadError) as exc:
                if not reused or (isinstance(exc, asyncio.IncompleteReadError) and exc.partial):
                    raise
                await self.close()
                reader, writer = await self._open()
                writer.write(raw)
                head = await reader.readuntil(b"\r\n\r\n")
            status, headers = _parse_head(head[:-4])
            keep = "close" not in headers.get("connection", "").lower()
            if status in (204, 304) or 100 <= status < 200:
                n = 0
            elif "chunked" in headers.get("transfer-encoding", "").lower():
                n = await self._chunked(reader, on_piece)
            elif "content-length" in headers:
                try:
                    length = int(headers["content-length"])
                except ValueError as exc:
                    raise MalformedResponse("bad Content-Length") from exc
                n = await self._sized(reader, length, on_piece)
            else:
                n = await self._until_close(reader, on_piece)
                keep = False
            if not keep:
                await self.close()
            return Answered(status, headers, n, keep)
        except BaseException:
            await self.close()
            raise

    @staticmethod
    async def _sized(reader: asyncio.StreamReader, length: int, on_piece: OnPiece) -> int:
        left = length
        while left > 0:
            data = await reader.read(min(left, READ_BYTES))
            if not data:
                raise MalformedResponse("connection closed inside the body")
            on_piece(data, time.perf_counter())
            left -= len(data)
        return length

    @staticmethod
    async def _chunked(reader: asyncio.StreamReader, on_piece: OnPiece) -> int:
        total = 0
        while True:
            line = await reader.readuntil(b"\r\n")
            try:
                size = int(line.split(b";", 1)[0].strip(), 16)
            except ValueError as exc:
                raise MalformedResponse(f"bad chunk size {line[:40]!r}") from exc
            if size == 0:
                # Trailers (if any) end with an empty line.
                while await reader.readuntil(b"\r\n") != b"\r\n":
                    pass
                return total
            data = await reader.readexactly(size + 2)
            if data[-2:] != b"\r\n":
                raise MalformedResponse("chunk not followed by CRLF")
            on_piece(data[:-2], time.perf_counter())
            total += size

    @staticmethod
    async def _until_close(reader: asyncio.StreamReader, on_piece: OnPiece) -> int:
        total = 0
        while data := await reader.read(READ_BYTES):
            on_piece(data, time.perf_counter())
            total += len(data)
        return total

    async def close(self) -> None:
        writer, self._reader, self._writer = self._writer, None, None
        if writer is not None:
            writer.close()
            with contextlib.suppress(OSError, ssl.SSLError):
                await writer.wait_closed()
