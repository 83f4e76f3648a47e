"""The connection: an ``asyncio.BufferedProtocol`` gluing ``http/`` to ``app/``.

Strategy
--------
``get_buffer()`` returns exactly the view ``HttpConnection.next_buffer()`` asks for, so a
Content-Length body is received by the kernel straight into its arena lease. Requests on
one connection are served one at a time (responses leave in request order); bytes of
pipelined requests wait in the head buffer, and reading pauses only when that is full,
so a client that closes while its request runs is noticed at once (its task is
cancelled).

Responses are written with ``transport.writelines`` from the app's buffers. The leases
behind them are released only once the transport has sent everything: if bytes remain
queued after a write, the high-water mark is dropped to zero, which makes the transport
call ``pause_writing`` now and ``resume_writing`` when it is empty.

Streams are written by ``_stream``: pieces are framed as they arrive and flushed once per
loop iteration (``call_soon``), so a burst costs one ``writelines`` while a lone piece
still leaves at once. At most ``STREAM_BATCH_PIECES`` / ``STREAM_BATCH_BYTES`` are gathered
before the writer flushes and yields, so a producer that never awaits cannot starve
other connections; while the transport is paused the writer waits for the drain: that is
the backpressure the producer feels.

Timeouts share one per-server ticker (``Server._tick``) that compares each connection's
``deadline`` with the clock; reads only store a float.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import socket
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, cast

from .. import metrics
from ..app.problems import ErrorFormat, error_body, error_response, internal_error
from ..app.request import Request
from ..app.response import Response, StreamResponse
from ..errors import ProtocolError, ZeroserveError
from ..http import response as framing
from ..http.connection import BodyComplete, HttpConnection, RequestHead, State
from .options import (
    DISCARD_MAX_BYTES,
    GATHER_MAX_BYTES,
    GATHER_MIN_BUFFERS,
    STREAM_BATCH_BYTES,
    STREAM_BATCH_PIECES,
    WRITE_HIGH_WATER,
    WRITE_LOW_WATER,
)

if TYPE_CHECKING:
    from .server import Server

log = logging.getLogger("zeroserve.server")

_BUSY_BODY = (
    b'{"error":{"message":"too many connections","type":"server_error","param":null,"code":"busy"}}'
)
_SERVICE_UNAVAILABLE = (
    b"HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\nconnection: close\r\n"
    b"retry-after: 1\r\ncontent-length: %d\r\n\r\n%s" % (len(_BUSY_BODY), _BUSY_BODY)
)


class LeaseSink:
    """Receives a decoded chunked body into a growing arena lease (the one counted copy)."""

    __slots__ = ("_alloc", "lease", "size")

    INITIAL = 64 * 1024

    def __init__(self, allocate: Callable[[int], Any]) -> None:
        self._alloc = allocate
        self.lease = allocate(self.INITIAL)
        self.size = 0

    def write(self, data: memoryview) -> None:
        n = len(data)
        end = self.size + n
        if end > self.lease.length:
            bigger = self._alloc(max(end, 2 * self.lease.length))
            bigger.view[: self.size] = self.lease.view[: self.size]
            metrics.count_copy("chunked_grow", self.size)
            self.lease.release()
            self.lease = bigger
        self.lease.view[self.size : end] = data
        self.size = end
        metrics.count_copy("chunked", n)

    def finish(self) -> Any:
        self.lease.shrink(self.size)
        return self.lease


class HttpProtocol(asyncio.BufferedProtocol):
    def __init__(self, server: Server) -> None:
        self.server = server
        self.loop = server.loop
        self.conn = HttpConnection(server.options.http)
        self.transport: asyncio.Transport | None = None
        self.deadline = 0.0  # loop time after which the connection is timed out
        self.request: Request | None = None
        self.task: asyncio.Task[None] | None = None
        self._sink: LeaseSink | None = None
        self._paused_reading = False
        self._paused_writing = False
        self._paused_since = 0.0
        self._drain_waiter: asyncio.Future[None] | None = None
        self._pending_release: list[Callable[[], None]] = []
        self._flush_mode = False
        self._closed = False
        self._responding = False  # a handler runs or a response is being written
        self._discarding = False  # reading the body of a request answered early
        self._started = 0.0
        # streaming state (one stream at a time per connection)
        self._out_head: bytes | None = None  # a stream's head, sent with its first pieces
        self._out: list[Any] = []  # framed body buffers not yet written
        self._out_pieces = 0
        self._out_bytes = 0  # size of _out on the wire (before chunk framing)
        self._flush_scheduled = False
        self._chunked_out = True

    # -- asyncio.BufferedProtocol --------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports do not subclass asyncio.Transport; they implement it.
        self.transport = transport = cast(asyncio.Transport, transport)
        server = self.server
        if len(server.connections) >= server.options.max_connections or server.draining:
            self._closed = True
            transport.write(_SERVICE_UNAVAILABLE)
            transport.close()
            return
        server.connections.add(self)
        sock = transport.get_extra_info("socket")
        if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
            try:
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            except OSError:
                pass
        transport.set_write_buffer_limits(high=WRITE_HIGH_WATER, low=WRITE_LOW_WATER)
        self.deadline = self.loop.time() + server.options.head_timeout

    def get_buffer(self, sizehint: int) -> memoryview:
        return self.conn.next_buffer()

    def buffer_updated(self, nbytes: int) -> None:
        conn = self.conn
        was_idle = conn.idle
        try:
            event = conn.buffer_updated(nbytes)
        except ProtocolError as exc:
            self._protocol_error(exc)
            return
        if event is None:
            state = conn.state
            if state is State.BODY or state is State.CHUNKED:
                self.deadline = self.loop.time() + self.server.options.body_timeout
            elif state is State.HEAD and was_idle:
                self.deadline = self.loop.time() + self.server.options.head_timeout
            if conn.reading_blocked:
                self._pause_reading()
            return
        self._drive(event)

    def eof_received(self) -> bool | None:
        # A client that half-closes is treated as gone (as uvicorn does): cancel its work.
        self.conn.eof = True
        return None  # the transport closes itself -> connection_lost

    def connection_lost(self, exc: Exception | None) -> None:
        self._closed = True
        self.server.connections.discard(self)
        self.conn.close()
        req = self.request
        if req is not None:
            req.mark_disconnected()
        if self.task is not None and not self.task.done():
            self.task.cancel()
        elif req is not None:
            self._release_request(req)
        if self._sink is not None:
            self._sink.lease.release()
            self._sink = None
        self._run_releases()
        self._wake_drain(ConnectionResetError("client disconnected"))

    def pause_writing(self) -> None:
        self._paused_writing = True
        self._paused_since = self.loop.time()

    def resume_writing(self) -> None:
        self._paused_writing = False
        if self._flush_mode:
            self._flush_mode = False
            assert self.transport is not None
            self.transport.set_write_buffer_limits(high=WRITE_HIGH_WATER, low=WRITE_LOW_WATER)
        self._run_releases()
        self._wake_drain(None)

    # -- request flow ---------------------------------------------------------------------
    def _drive(self, event: RequestHead | BodyComplete | None) -> None:
        """Handle events until one needs to wait (body bytes, an async handler)."""
        while event is not None and not self._closed:
            if isinstance(event, RequestHead):
                event = self._on_head(event)
            else:
                event = self._on_body_complete()

    def _on_head(self, head: RequestHead) -> RequestHead | BodyComplete | None:
        self._started = self.loop.time()
        app = self.server.app
        try:
            req = app.on_head(head)
        except ZeroserveError as exc:
            return self._early_error(head, exc)
        except Exception:
            log.exception("error in head handler for %s %s", head.method, head.path)
            return self._early_error(head, ZeroserveError("internal server error"))
        self.request = req
        if not head.has_body:
            return self._dispatch(req)
        assert self.transport is not None
        try:
            if head.chunked:
                self._sink = LeaseSink(self.server.arena.allocate)
            else:
                assert head.content_length is not None
                req.lease = self.server.arena.allocate(head.content_length)
        except ZeroserveError as exc:
            self._release_request(req)
            self.request = None
            return self._early_error(head, exc)
        if head.expect_continue:
            self.transport.write(framing.CONTINUE)
        before = self.conn.overflow_copied
        try:
            if self._sink is not None:
                done = self.conn.receive_chunked(self._sink)
            else:
                done = self.conn.receive_into(req.lease.view)
        except ProtocolError as exc:
            self._protocol_error(exc)
            return None
        copied = self.conn.overflow_copied - before
        if copied:
            metrics.count_copy("head_overflow", copied)
        if done is None:
            self.deadline = self.loop.time() + self.server.options.body_timeout
            return None
        return done

    def _on_body_complete(self) -> RequestHead | BodyComplete | None:
        if self._discarding:  # the body of a request already answered early
            self._discarding = False
            try:
                return self.conn.response_complete(keep_alive=True)
            except ProtocolError as exc:
                self._protocol_error(exc)
                return None
        req = self.request
        assert req is not None
        if self._sink is not None:
            req.lease = self._sink.finish()
            self._sink = None
        req.body = req.lease.view
        return self._dispatch(req)

    def _dispatch(self, req: Request) -> RequestHead | BodyComplete | None:
        self._responding = True
        self.deadline = 0.0  # no read deadline while the app works
        metrics.count_payload("in", len(req.body))
        try:
            result = self.server.app.handle(req)
        except ZeroserveError as exc:
            result = error_response(exc, req.route.errors)
        except Exception:
            log.exception("unhandled error in %s %s", req.method, req.path)
            result = internal_error(req.route.errors)
        if inspect.isawaitable(result) or isinstance(result, StreamResponse):
            task = self.task = self.loop.create_task(self._run(req, result))
            # A task cancelled before its first step never enters _run's handlers.
            task.add_done_callback(lambda t: self._release_request(req) if t.cancelled() else None)
            return None
        return self._send(req, result)

    async def _run(self, req: Request, pending: Any) -> None:
        fmt = req.route.errors
        try:
            try:
                result = await pending if inspect.isawaitable(pending) else pending
            except ZeroserveError as exc:
                result = error_response(exc, fmt)
            if isinstance(result, StreamResponse):
                await self._stream(req, result)
                nxt = self._finish(req, keep_alive=self._keep_alive(req))
            else:
                nxt = self._send(req, result)
        except asyncio.CancelledError:
            self._release_request(req)
            raise
        except (ConnectionError, OSError):
            self._release_request(req)
            self._abort()
            return
        except Exception:
            log.exception("unhandled error in %s %s", req.method, req.path)
            if self.request is req and not self._closed:
                nxt = self._send(req, internal_error(fmt))
            else:
                return
        finally:
            self.task = None
        self._drive(nxt)

    def _keep_alive(self, req: Request) -> bool:
        return req.head.keep_alive and not self.server.draining and not self.conn.eof

    def _send(self, req: Request, resp: Response) -> RequestHead | BodyComplete | None:
        transport = self.transport
        if transport is None or self._closed:
            self._release_request(req)
            return None
        keep_alive = self._keep_alive(req)
        body = resp.body
        size = framing.buffers_size(body)
        head = framing.encode_head(resp.status, resp.headers, content_length=size, keep_alive=keep_alive)
        if req.head.method == "HEAD" or not size:
            transport.write(head)
        else:
            transport.writelines([head, *body])
            metrics.count_payload("out", size)
        self._pending_release.extend(resp.release)
        metrics.count_request(req.route.name, resp.status)
        return self._finish(req, keep_alive)

    def _finish(self, req: Request, keep_alive: bool) -> RequestHead | BodyComplete | None:
        req.route.timer(self.loop.time() - self._started)
        self.request = None
        self._responding = False
        ticket = req.state.pop("ticket", None)  # a handler that failed before using it
        if ticket is not None:
            ticket.release()
        if req.lease is not None:
            self._pending_release.append(req.lease.release)
            req.lease = None
        self._schedule_releases()
        transport = self.transport
        assert transport is not None
        if not keep_alive:
            self.conn.close()
            transport.close()  # flushes what is queued, then closes
            return None
        try:
            nxt = self.conn.response_complete(keep_alive=True)
        except ProtocolError as exc:
            self._protocol_error(exc)
            return None
        if self._paused_reading:
            self._paused_reading = False
            transport.resume_reading()
        if nxt is None:
            self.deadline = self.loop.time() + (
                self.server.options.keepalive_timeout if self.conn.idle else self.server.options.head_timeout
            )
        return nxt

    # -- errors -----------------------------------------------------------------------------
    def _early_error(self, head: RequestHead, exc: ZeroserveError) -> RequestHead | BodyComplete | None:
        """Answer before the body is read (404, 413, 429, ...). A small Content-Length body
        is then read into a scratch buffer and dropped, so the connection stays usable: a
        client told 429 retries on it instead of reconnecting, which matters most under
        overload. Other bodies (large, chunked, or held back by Expect: 100-continue) make
        the framing unusable: the connection closes after the answer."""
        transport = self.transport
        assert transport is not None
        fmt = self.server.app.error_format(head.path)
        resp = error_response(exc, fmt)
        discard = (
            bool(head.content_length)
            and head.content_length is not None
            and head.content_length <= DISCARD_MAX_BYTES
            and not head.expect_continue
            and exc.status != 413
        )
        keep_alive = head.keep_alive and (not head.has_body or discard) and not self.server.draining
        size = framing.buffers_size(resp.body)
        out = framing.encode_head(resp.status, resp.headers, content_length=size, keep_alive=keep_alive)
        transport.writelines([out] if head.method == "HEAD" else [out, *resp.body])
        metrics.count_request("early", resp.status)
        if not keep_alive:
            self.conn.close()
            transport.close()
            return None
        self._started = self.loop.time()
        if head.has_body:
            assert head.content_length is not None
            self._discarding = True
            done = self.conn.receive_into(memoryview(bytearray(head.content_length)))
            if done is None:
                self.deadline = self.loop.time() + self.server.options.body_timeout
                return None
            self._discarding = False
        try:
            return self.conn.response_complete(keep_alive=True)
        except ProtocolError as exc2:
            self._protocol_error(exc2)
            return None

    def _protocol_error(self, exc: ProtocolError) -> None:
        transport = self.transport
        if transport is None or self._closed:
            return
        if self._responding:
            # Bytes after a request we are still answering broke framing: just close.
            self._abort()
            return
        fmt: ErrorFormat = (
            self.server.app.error_format(self.conn.head.path) if self.conn.head else "openai"
        )
        if self.request is not None:  # the body was bad: the request never ran
            self._release_request(self.request)
            self.request = None
        resp = error_response(exc, fmt)
        size = framing.buffers_size(resp.body)
        out = framing.encode_head(resp.status, resp.headers, content_length=size, keep_alive=False)
        transport.writelines([out, *resp.body])
        metrics.count_request("protocol_error", exc.status)
        self.conn.close()
        if self._sink is not None:
            self._sink.lease.release()
            self._sink = None
        transport.close()

    def _release_request(self, req: Request) -> None:
        if req.lease is not None:
            req.lease.release()
            req.lease = None
        ticket = req.state.pop("ticket", None)
        if ticket is not None:
            ticket.release()

    # -- writing ------------------------------------------------------------------------------
    def _schedule_releases(self) -> None:
        if not self._pending_release:
            return
        transport = self.transport
        if transport is None or self._closed or transport.get_write_buffer_size() == 0:
            self._run_releases()
            return
        if not self._paused_writing and not self._flush_mode:
            # Ask the transport to tell us when it is empty: pause now, resume at zero.
            self._flush_mode = True
            transport.set_write_buffer_limits(high=0, low=0)

    def _run_releases(self) -> None:
        pending, self._pending_release = self._pending_release, []
        for release in pending:
            try:
                release()
            except Exception:
                log.exception("release callback failed")

    def _wake_drain(self, exc: Exception | None) -> None:
        waiter = self._drain_waiter
        if waiter is not None and not waiter.done():
            self._drain_waiter = None
            if exc is None:
                waiter.set_result(None)
            else:
                waiter.set_exception(exc)

    async def drain(self) -> None:
        if self._closed:
            raise ConnectionResetError("client disconnected")
        if not self._paused_writing:
            return
        waiter = self._drain_waiter
        if waiter is None:
            waiter = self._drain_waiter = self.loop.create_future()
        await waiter

    def _pause_reading(self) -> None:
        if not self._paused_reading and self.transport is not None:
            self._paused_reading = True
            self.transport.pause_reading()

    def _abort(self) -> None:
        self._closed = True
        if self.transport is not None:
            self.transport.abort()

    # -- streaming ----------------------------------------------------------------------------
    async def _stream(self, req: Request, resp: StreamResponse) -> None:
        transport = self.transport
        assert transport is not None
        it = resp.pieces.__aiter__()
        sse = resp.framing == "sse"
        self._chunked_out = req.head.version == "1.1"
        try:
            try:
                first = await it.__anext__()
            except StopAsyncIteration:
                first = None
            except ZeroserveError as exc:
                # Nothing was sent yet: answer with a proper status.
                self._send_nofinish(req, error_response(exc, req.route.errors))
                return
            keep_alive = self._keep_alive(req)
            if not self._chunked_out:
                keep_alive = False
                req.head.keep_alive = False
            head = framing.encode_head(
                resp.status, resp.headers, chunked=self._chunked_out, keep_alive=keep_alive
            )
            metrics.count_request(req.route.name, resp.status)
            if req.head.method == "HEAD":
                transport.write(head)
                return
            self._out_head = head
            self._out = []
            self._out_pieces = 0
            self._out_bytes = 0
            if first is not None:
                batch = getattr(it, "receive_batch_nowait", None)
                ready = [first]
                if batch is not None:
                    ready += batch(STREAM_BATCH_PIECES - 1)
                self._add_pieces(ready, sse)
                self._flush_stream()
                while True:
                    try:
                        piece = await it.__anext__()
                    except (StopAsyncIteration, asyncio.CancelledError):
                        raise
                    except Exception as exc:
                        self._stream_failed(req, exc, sse)
                        return
                    if batch is None:
                        self._add_pieces([piece], sse)
                    else:
                        # Everything else that is ready goes out in the same write.
                        ready = [piece]
                        ready += batch(STREAM_BATCH_PIECES - 1 - self._out_pieces)
                        self._add_pieces(ready, sse)
                    if not self._flush_scheduled:
                        self._flush_scheduled = True
                        self.loop.call_soon(self._flush_stream)
                    if self._out_pieces >= STREAM_BATCH_PIECES or self._out_bytes >= STREAM_BATCH_BYTES:
                        self._flush_stream()
                        await asyncio.sleep(0)
                    if self._paused_writing:
                        self._flush_stream()
                        await self.drain()
        except StopAsyncIteration:
            pass
        finally:
            aclose = getattr(it, "aclose", None)
            if resp.aclose is not None:
                await _maybe_await(resp.aclose())
            elif aclose is not None:
                await aclose()
        if self._closed:
            raise ConnectionResetError("client disconnected")
        if self._out or self._out_head is not None or first is not None:
            self._flush_stream(last=True)

    def _stream_failed(self, req: Request, exc: Exception, sse: bool) -> None:
        """A stream failed after its head was sent. SSE clients get a final error event in
        the route's error format and a clean end; raw chunked streams are cut off (an
        incomplete chunked body is how HTTP/1.1 signals a failed transfer)."""
        if not isinstance(exc, ZeroserveError):
            log.error("stream for %s %s failed", req.method, req.path, exc_info=exc)
            exc = ZeroserveError("internal server error while streaming")
        if sse:
            self._out_bytes += framing.sse_event(error_body(exc, req.route.errors), self._out)
            self._flush_stream(last=True)
            return
        self._flush_stream()
        req.head.keep_alive = False
        self._abort()

    def _add_pieces(self, pieces: list[Any], sse: bool) -> None:
        """Frame ``pieces`` onto the pending output (SSE events, or raw chunk data)."""
        flat: list[Any] = []
        for piece in pieces:
            kind = type(piece)
            if kind is str:
                flat.append(piece.encode())
            elif kind is list:
                flat += [p.encode() if type(p) is str else p for p in piece]
            else:
                flat.append(piece)
        self._out_pieces += len(flat)
        out = self._out
        if not sse:
            for piece in flat:
                n = piece.nbytes if type(piece) is memoryview else len(piece)
                if n:
                    out.append(piece)
                    self._out_bytes += n
            return
        if len(flat) > GATHER_MIN_BUFFERS:
            # Short pieces (tokens): frame them all with two C-level joins instead of
            # three buffers per event. One copy, counted; payload-sized pieces and pieces
            # with line breaks (several data: lines) take the per-event path below.
            joined = b"".join(flat)
            if (
                len(joined) < GATHER_MAX_BYTES * len(flat)
                and b"\n" not in joined
                and b"\r" not in joined
            ):
                framed = b"data: " + b"\n\ndata: ".join(flat) + b"\n\n"
                metrics.count_copy("stream_gather", len(joined))
                out.append(framed)
                self._out_bytes += len(framed)
                return
        for piece in flat:
            n = piece.nbytes if type(piece) is memoryview else len(piece)
            self._out_bytes += framing.sse_event(piece, out, n)

    def _flush_stream(self, last: bool = False) -> None:
        self._flush_scheduled = False
        body, size = self._out, self._out_bytes
        transport = self.transport
        self._out = []
        self._out_pieces = 0
        self._out_bytes = 0
        if transport is None or self._closed:
            return
        head, self._out_head = self._out_head, None
        buffers: list[framing.Buffer] = [head] if head is not None else []
        if size:
            metrics.count_payload("out", size)
            if len(body) > GATHER_MIN_BUFFERS and size < GATHER_MAX_BYTES * len(body):
                # Many tiny buffers: one copy into a single buffer costs less CPU than a
                # writev over all of them (measured: 63 vs 157 CPU-us for the 768 buffers
                # of a 256-event stream). Counted, like every copy.
                body = [b"".join(body)]
                metrics.count_copy("stream_gather", size)
            if self._chunked_out:
                buffers.append(b"%x\r\n" % size)
                buffers += body
                buffers.append(framing.CRLF)
            else:
                buffers += body
        if last and self._chunked_out:
            buffers.append(framing.LAST_CHUNK)
        if buffers:
            transport.writelines(buffers)

    def _send_nofinish(self, req: Request, resp: Response) -> None:
        assert self.transport is not None
        size = framing.buffers_size(resp.body)
        req.head.keep_alive = self._keep_alive(req)
        head = framing.encode_head(resp.status, resp.headers, content_length=size, keep_alive=req.head.keep_alive)
        self.transport.writelines([head, *resp.body])
        metrics.count_request(req.route.name, resp.status)
        self._pending_release.extend(resp.release)

    # -- server hooks ---------------------------------------------------------------------------
    def check_timeout(self, now: float) -> None:
        if self.deadline and now > self.deadline:
            log.debug("connection timed out in state %s", self.conn.state)
            if self.conn.state is State.HEAD and self.conn.buffered and self.transport is not None:
                self._protocol_error(ProtocolError("request head timeout", status=408))
                return
            self._abort()
        elif self._paused_writing and now - self._paused_since > self.server.options.write_timeout:
            self._abort()

    def close_if_idle(self) -> None:
        """Close between requests (for drain). Queued response bytes are still sent."""
        if self.conn.idle and self.request is None and self.task is None and self.transport is not None:
            self.transport.close()


async def _maybe_await(value: Any) -> None:
    if inspect.isawaitable(value):
        await value
