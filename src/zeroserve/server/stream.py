"""The stream writer loop: a streamed body's pieces, framed and written as they arrive.

Strategy
--------
Pieces are framed by ``http.framing.StreamFramer`` as they arrive and flushed once per
loop iteration (``call_soon``), so a burst costs one ``writelines`` while a lone piece
still leaves at once. At most ``STREAM_BATCH_PIECES`` / ``STREAM_BATCH_BYTES`` are
gathered before the writer flushes and yields, so a producer that never awaits cannot
starve other connections; while the transport is paused the writer waits for the drain
(``WriteFlow.drain``): that is the backpressure the producer feels.

``start`` sends a new stream's head and first ready pieces from the I/O callback that
completed its request (no task switch), so a new client's first event does not wait
behind the batches the other streams have queued on the loop; ``respond`` (in the
connection's task) sends the rest. Without a ready piece, ``respond`` awaits the first
piece (a failure then is still answered with a proper status). The head and its framing
come from ``HttpConnection.start_response``; ``respond`` ends the body, or a failed one (an SSE stream gets
a final error event and a clean end; a raw chunked stream is cut off, which is how
HTTP/1.1 signals a failed transfer). It only moves bytes (docs/architecture.md,
"server/: asyncio glue").
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any, Protocol

from .. import metrics
from ..app.problems import error_body, error_response
from ..app.request import Request
from ..app.response import PieceStream, Response, StreamResponse
from ..edge import EdgeContext
from ..errors import ZeroserveError
from ..http.connection import HttpConnection
from ..http.framing import StreamFramer
from .flow import WriteFlow
from .options import STREAM_BATCH_BYTES, STREAM_BATCH_PIECES
from .turns import Turns

log = logging.getLogger("zeroserve.server")


class Draining(Protocol):
    """The server, as far as a stream needs it: whether it is draining, and the turn its
    streams share."""

    @property
    def draining(self) -> bool: ...

    @property
    def turns(self) -> Turns: ...


def abort(flow: WriteFlow, conn: HttpConnection) -> None:
    """Cut the connection off now (nothing queued is sent)."""
    flow.closed = True
    conn.close()
    if flow.transport is not None:
        flow.transport.abort()


class StreamWriter:
    """Writes the streamed bodies of one connection, one at a time."""

    __slots__ = (
        "_counted",
        "_ctx",
        "_flush_scheduled",
        "_server",
        "conn",
        "flow",
        "framer",
        "loop",
        "turns",
    )

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        flow: WriteFlow,
        conn: HttpConnection,
        server: Draining,
    ) -> None:
        self.loop = loop
        self.flow = flow
        self.conn = conn
        self._server = server
        self.turns = server.turns
        self.framer = StreamFramer()
        self._flush_scheduled = False
        self._ctx: EdgeContext | None = None  # the stream's request, as the edge sees it
        # The edge that counts this stream's pieces as tokens (a raw stream with a key's
        # token quota, an access log or tracing), else None.
        self._counted: EdgeContext | None = None

    def start(self, req: Request, resp: StreamResponse) -> bool:
        """Send the head and the first pieces now, from the I/O callback that completed
        the request, if some are ready without waiting: a new stream's first event then
        does not wait behind the batches other streams have queued on the loop. False
        (nothing sent) if none is ready: ``respond`` then waits for the first piece."""
        clock = self.turns.clock
        began = clock()
        ready = resp.pieces.receive_batch_nowait(STREAM_BATCH_PIECES)
        if not ready:
            return False
        head = self._head(req, resp, True)
        conn = self.conn
        self.framer.begin(head, chunked=conn.chunked_out, sse=resp.framing == "sse")
        if conn.body_allowed:
            self.framer.add(ready)
            if self._counted is not None:
                self._counted.count_tokens(len(ready))
        self.flush()
        self.turns.charge(clock() - began)  # never deferred; the old streams yield to it
        return True

    def _head(self, req: Request, resp: StreamResponse, has_piece: bool) -> bytes:
        ctx = self._ctx = req.edge
        self._counted = ctx if ctx is not None and ctx.counting and resp.counts_pieces else None
        headers = resp.headers if ctx is None else ctx.response_headers(resp.headers)
        head = self.conn.start_response(
            resp.status, headers, content_length=None, draining=self._server.draining
        )
        metrics.count_request(req.route.name, resp.status)
        if ctx is not None:
            ctx.status = resp.status
            if has_piece:
                ctx.first_piece()
        return head

    async def respond(
        self, req: Request, resp: StreamResponse, *, started: bool = False
    ) -> Response | None:
        """Send one streaming response (its head and first pieces already sent if
        ``started``, see ``start``). Returns the error response to send instead if the
        stream failed before its first piece (nothing was sent yet), else None. Raises
        ``ConnectionResetError`` if the client went away."""
        it = resp.pieces
        # ``it`` is closed after the handler, not in a ``finally``: compiled code must not
        # await inside one (docs/decisions/0009-no-await-in-handlers-when-compiled.md).
        failure: BaseException | None = None
        answer: Response | None = None
        ended = sent = False
        try:
            answer, ended, sent = await self._pieces(req, resp, started)
        except BaseException as exc:
            failure = exc
        await it.aclose()
        if failure is not None:
            raise failure
        if not ended:
            return answer
        if self.flow.closed:
            raise ConnectionResetError("client disconnected")
        if self.framer.pending or sent:
            self.flush(last=True)
        return None

    async def _pieces(
        self, req: Request, resp: StreamResponse, started: bool
    ) -> tuple[Response | None, bool, bool]:
        """``respond``'s body: the error response to send instead (or None), whether the
        stream ran to its end (its last batch is still to flush), and whether a piece was
        sent."""
        transport = self.flow.transport
        assert transport is not None
        it = resp.pieces
        sse = resp.framing == "sse"
        sent = started
        if started:
            if not self.conn.body_allowed:
                return None, False, sent
            failed = await self._rest(it)
        else:
            try:
                first = await it.__anext__()
            except StopAsyncIteration:
                first = None
            except ZeroserveError as exc:
                return error_response(exc, req.route.errors, _request_id(req)), False, sent
            head = self._head(req, resp, first is not None)
            conn = self.conn
            if not conn.body_allowed:
                transport.write(head)
                return None, False, sent
            sent = first is not None
            failed = await self.write(head, it, first, sse=sse, chunked=conn.chunked_out)
        if failed is not None:
            self._failed(req, failed, sse)
            return None, False, sent
        return None, True, sent

    def _failed(self, req: Request, exc: Exception, sse: bool) -> None:
        """The stream failed after its head was sent."""
        if not isinstance(exc, ZeroserveError):
            log.error("stream for %s %s failed", req.method, req.path, exc_info=exc)
            exc = ZeroserveError("internal server error while streaming")
        if req.edge is not None:
            req.edge.failed = "deadline" if exc.status == 504 else "error"
        if sse:
            self.framer.add_event(error_body(exc, req.route.errors, _request_id(req)))
            self.flush(last=True)
            return
        self.flush()
        abort(self.flow, self.conn)

    async def write(
        self, head: bytes, it: PieceStream, first: Any, *, sse: bool, chunked: bool
    ) -> Exception | None:
        """Send ``head``, ``first`` and the rest of ``it``. Returns the exception the
        iterator raised after the head was sent (the caller ends the stream), else None.
        The last chunk is not written: ``flush(last=True)`` ends the body."""
        framer = self.framer
        framer.begin(head, chunked=chunked, sse=sse)
        if first is None:
            return None
        ready = [first]
        ready += it.receive_batch_nowait(STREAM_BATCH_PIECES - 1)
        framer.add(ready)
        if self._counted is not None:
            self._counted.count_tokens(len(ready))
        self.flush()
        return await self._rest(it)

    async def _rest(self, it: PieceStream) -> Exception | None:
        """Frame and write the pieces of ``it`` as they come (the head is sent)."""
        framer = self.framer
        flow = self.flow
        batch = it.receive_batch_nowait
        turns = self.turns
        clock = turns.clock
        counted = self._counted
        granted = False  # this batch already waited for its turn
        while True:
            try:
                piece = await it.__anext__()
            except StopAsyncIteration:
                return None
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                return exc
            if not granted and turns.over():  # this iteration's stream work is spent
                await turns.wait()
            granted = False
            began = clock()
            # Everything else that is ready goes out in the same write.
            ready = [piece]
            ready += batch(STREAM_BATCH_PIECES - 1 - framer.pieces)
            framer.add(ready)
            if counted is not None:
                counted.count_tokens(len(ready))
            if not self._flush_scheduled:
                self._flush_scheduled = True
                self.loop.call_soon(self.flush)
            full = framer.pieces >= STREAM_BATCH_PIECES or framer.size >= STREAM_BATCH_BYTES
            if full:
                self.flush()
            turns.charge(clock() - began)
            if full:
                # Yield to the loop: for a later turn if this one is spent (the next batch
                # is then granted), else just to let the others run.
                if turns.over():
                    await turns.wait()
                    granted = True
                else:
                    await asyncio.sleep(0)
            if flow.paused:
                self.flush()
                await flow.drain()

    def flush(self, last: bool = False) -> None:
        """Write what is pending (and the last chunk if ``last``)."""
        self._flush_scheduled = False
        transport = self.flow.transport
        if transport is None or self.flow.closed:
            self.framer.discard()
            return
        if self._ctx is not None:
            self._ctx.bytes_out += self.framer.size
        buffers = self.framer.flush(last)
        if buffers:
            transport.writelines(buffers)


def _request_id(req: Request) -> bytes:
    return req.edge.request_id if req.edge is not None else b""
