"""The connection callbacks: an ``asyncio.BufferedProtocol`` gluing ``http/`` to ``app/``.

Strategy
--------
``get_buffer()`` returns exactly the view ``HttpConnection.next_buffer()`` asks for, so a
Content-Length body is received by the kernel straight into its arena lease. Requests on
one connection are served one at a time (responses leave in request order); bytes of
pipelined requests wait in the head buffer, and reading pauses only when that is full,
so a client that closes while its request runs is noticed at once (its task is
cancelled).

Every HTTP decision (framing, HEAD, 100-continue, keep-alive, discarding the body of an
early answer) is ``HttpConnection``'s; this module moves its bytes, runs the app, and
keeps the timeouts. Write flow control is ``flow.WriteFlow``, streamed bodies are
``stream.StreamWriter``'s, chunked request bodies go to ``sinks.LeaseSink``
(docs/architecture.md, "server/: asyncio glue").

Timeouts share one per-server ticker (``Server._tick``) that compares each connection's
``deadline`` with the clock; reads only store a float.
"""

from __future__ import annotations

import asyncio
import inspect
import ipaddress
import logging
import os
import socket
from typing import Protocol, cast

from .. import metrics
from ..app.problems import ErrorFormat, error_response, internal_error
from ..app.request import Request
from ..app.response import HandlerResult, Response, StreamResponse
from ..edge import Edge, EdgeContext, EdgeEnd
from ..edge.access_log import Outcome
from ..errors import Overloaded, ProtocolError, ZeroserveError
from ..http import framing
from ..http.connection import BodyComplete, HttpConnection, RequestHead, State
from ..runtime.arena import Arena
from .flow import WriteFlow
from .hosted import HostedApp
from .options import ServerOptions
from .sinks import LeaseSink
from .stream import StreamWriter, abort
from .turns import Turns


class ServerView(Protocol):
    """The server as a connection needs it (``server.Server``; typed here so that the
    connection does not import the module that imports it)."""

    app: HostedApp
    busy: bytes  # the whole 503 answer to a connection past ``max_connections``
    arena: Arena  # typed, like ``edge`` below: compiled code calls them natively
    options: ServerOptions
    connections: set[HttpProtocol]
    idle: dict[HttpProtocol, None]  # keep-alive connections between requests, oldest first
    draining: bool
    closing: bool  # the listener is closed: new connections are refused
    tls: bool
    loop: asyncio.AbstractEventLoop
    turns: Turns

    def evict_idle(self) -> bool: ...


# The window a stored body (``Request.store_body``) arrives through, bytes: each fill is
# one write to its store; large enough that the writes are few, small beside the arena.
STORED_BODY_WINDOW = 1024 * 1024
# Reads a new connection makes before the loop reads for it (``_read_early``): a head over
# its first windows (1 KiB, doubling as the head grows), then its body.
EARLY_READS = 6

log = logging.getLogger("zeroserve.server")


def busy_answer(app: HostedApp) -> bytes:
    """The whole 503 answer to a connection past ``max_connections`` (sent before a byte
    of it is read: in the app's default error format)."""
    exc = Overloaded("too many connections", status=503, retry_after=1.0)
    exc.code = "busy"
    body = app.error_body(exc, app.error_format("/"))
    return framing.refusal(503, [(b"content-type", b"application/json"), *exc.headers], body)


def is_loopback(peername: object) -> bool:
    """Whether a transport's ``peername`` is this host: a loopback IP address (127.0.0.0/8,
    ::1, an IPv4-mapped loopback), or a Unix socket's peer (not a tuple)."""
    if not isinstance(peername, tuple):
        return peername is not None
    try:
        addr = ipaddress.ip_address(str(peername[0]).partition("%")[0])
    except ValueError:
        return False
    if isinstance(addr, ipaddress.IPv6Address) and addr.ipv4_mapped is not None:
        return addr.ipv4_mapped.is_loopback
    return addr.is_loopback


class HttpProtocol(asyncio.BufferedProtocol):
    def __init__(self, server: ServerView) -> None:
        self.server = server
        self.loop = server.loop
        self.conn = HttpConnection(server.options.http)
        self.tls = server.tls  # received bytes were copied out of the decryption buffer
        self.flow = WriteFlow(self.loop)
        self._writer: StreamWriter | None = None  # made by the connection's first stream
        self.transport: asyncio.Transport | None = None
        self.deadline = 0.0  # loop time after which the connection is timed out
        self.request: Request | None = None
        self.task: asyncio.Task[None] | None = None
        self._sink: LeaseSink | None = None
        self._paused_reading = False
        self._responding = False  # a handler runs or a response is being written
        self._started = 0.0
        # Held typed: with an untyped app every call on the edge (start, admit,
        # release_quota, and the attribute reads) went through Python's generic method
        # lookup, ~1.5 k instructions a keyed request under callgrind
        # (docs/decisions/0008-types-decide-the-calls.md).
        self.edge: Edge = server.app.edge
        self._ctx: EdgeContext | None = None  # the edge's view of the current request
        self._head: RequestHead | None = None  # the head it belongs to
        self.loopback = False  # the peer is this host (admin routes without API keys)

    # -- asyncio.BufferedProtocol --------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports do not subclass asyncio.Transport; they implement it.
        self.transport = transport = cast(asyncio.Transport, transport)
        server = self.server
        if server.closing or (
            len(server.connections) >= server.options.max_connections and not server.evict_idle()
        ):
            self.flow.closed = True
            transport.write(server.busy)
            transport.close()
            return
        server.connections.add(self)
        self.loopback = is_loopback(transport.get_extra_info("peername"))
        sock = transport.get_extra_info("socket")
        tcp = sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6)
        if tcp:
            try:
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            except OSError:
                pass
        self.flow.attach(transport)
        self.deadline = self.loop.time() + server.options.head_timeout
        if tcp and not self.tls:
            self._read_early(sock.fileno(), transport)

    def _read_early(self, fd: int, transport: asyncio.Transport) -> None:
        """Read what the client sent with its connect, now
        (docs/decisions/0015-early-reads-of-a-new-connection.md). The loop calls
        ``connection_made`` one iteration after the accept and only then starts reading, so the request, usually already in the
        socket, would wait for a third iteration; under load each is milliseconds. These
        are the transport's own reads, into the buffers it would get (``get_buffer``): no
        copy. They stop once a request is in hand (a handler runs), at an empty socket, an
        EOF or an error (left for the transport's own read to find), or after
        ``EARLY_READS``. They never fill the head buffer's last byte, so that buffer is
        never full here and the connection never asks to pause reading: the loop starts
        reading when this returns, whatever the protocol asked. A body view (a lease of the
        body's exact size) is filled whole: nothing else lands in it."""
        conn = self.conn
        for _ in range(EARLY_READS):
            state = conn.state
            if state is not State.HEAD and state is not State.BODY:
                return
            view = self.get_buffer(-1)
            room = len(view) if state is State.BODY else min(len(view), conn.unread_room - 1)
            if room <= 0:
                return
            try:
                n = os.readv(fd, [view[:room]])
            except OSError:
                return
            if n <= 0:
                return
            self.buffer_updated(n)
            if self.flow.closed or transport.is_closing():
                return

    def get_buffer(self, sizehint: int) -> memoryview:
        return self.conn.next_buffer()

    def buffer_updated(self, nbytes: int) -> None:
        if self.tls:
            metrics.count_copy("tls", nbytes)
        conn = self.conn
        was_idle = conn.idle
        if was_idle:
            self.server.idle.pop(self, None)  # busy again (a no-op for a new connection)
        try:
            event = conn.buffer_updated(nbytes)
        except ProtocolError as exc:
            self._protocol_error(exc)
            return
        if event is None:
            state = conn.state
            if (
                state is State.BODY
                or state is State.STREAMED
                or state is State.CHUNKED
                or state is State.DISCARD
            ):
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
        self.flow.closed = True
        self.server.connections.discard(self)
        self.server.idle.pop(self, None)
        self.conn.close()
        req = self.request
        if req is not None:
            req.mark_disconnected()
        if self._ctx is not None:
            self._edge_end("client_gone")
        if self.task is not None and not self.task.done():
            self.task.cancel()
        elif req is not None:
            self._release_request(req)
        if self._sink is not None:
            self._sink.lease.release()
            self._sink = None
        self.flow.lost()

    def pause_writing(self) -> None:
        self.flow.pause()

    def resume_writing(self) -> None:
        self.flow.resume()

    # -- request flow ---------------------------------------------------------------------
    def _drive(self, event: RequestHead | BodyComplete | None) -> None:
        """Handle events until one needs to wait (body bytes, an async handler)."""
        while event is not None and not self.flow.closed:
            if isinstance(event, RequestHead):
                event = self._on_head(event)
            else:
                event = self._on_body_complete()

    def _on_head(self, head: RequestHead) -> RequestHead | BodyComplete | None:
        self._started = self.loop.time()
        app = self.server.app
        # The edge runs first: CORS preflight, API key and quota before routing and
        # before any body byte (docs/architecture.md, "The edge").
        ctx = self._ctx = self.edge.start(head.method, head.headers, head.path)
        self._head = head
        if ctx.preflight:  # 204 No Content, as browsers and most servers expect
            return self._early_answer(Response(204), "done")
        try:
            self.edge.admit(ctx, head.path, head.query)
            req = app.on_head(head, ctx)
        except ZeroserveError as exc:
            return self._early_error(head, exc)
        except Exception:
            log.exception("error in head handler for %s %s", head.method, head.path)
            return self._early_error(head, ZeroserveError("internal server error"))
        req.edge = ctx
        req.loopback = self.loopback
        ctx.model = req.params.get("model")  # raw and V2 routes; OpenAI names it later
        if ctx.trace is not None:
            self.edge.phase(ctx, None, route=req.route.name)
        self.request = req
        if not head.has_body:
            return self._dispatch(req)
        assert self.transport is not None
        stored = req.body_store  # the route stores the body as it arrives (an upload)
        try:
            if stored is not None:
                if not head.chunked:  # the window it arrives through
                    assert head.content_length is not None
                    window = min(head.content_length, STORED_BODY_WINDOW)
                    req.lease = self.server.arena.allocate(window)
            elif head.chunked:
                self._sink = LeaseSink(self.server.arena.allocate)
            else:
                assert head.content_length is not None
                req.lease = self.server.arena.allocate(head.content_length)
        except ZeroserveError as exc:
            self._release_request(req)
            self.request = None
            return self._early_error(head, exc)
        conn = self.conn
        line = conn.continue_line()
        if line is not None:
            self.transport.write(line)
        before = conn.overflow_copied
        try:
            if stored is not None:
                if head.chunked:
                    done = conn.receive_chunked(stored)
                else:
                    assert req.lease is not None
                    done = conn.receive_streamed(stored, req.lease.view)
            elif self._sink is not None:
                done = conn.receive_chunked(self._sink)
            else:
                lease = req.lease
                assert lease is not None
                done = conn.receive_into(lease.view)
        except ProtocolError as exc:
            self._protocol_error(exc)
            return None
        copied = conn.overflow_copied - before
        if copied:
            metrics.count_copy("head_overflow", copied)
        if done is None:
            self.deadline = self.loop.time() + self.server.options.body_timeout
            return None
        return done

    def _on_body_complete(self) -> RequestHead | BodyComplete | None:
        req = self.request
        assert req is not None
        if self._sink is not None:
            req.lease = self._sink.finish()
            self._sink = None
        if req.body_store is None:
            assert req.lease is not None
            req.body = req.lease.view
        return self._dispatch(req)

    def _dispatch(self, req: Request) -> RequestHead | BodyComplete | None:
        self._responding = True
        self.deadline = 0.0  # no read deadline while the app works
        metrics.count_payload("in", len(req.body))
        ctx = self._ctx
        if ctx is not None and ctx.trace is not None:
            ctx.trace.enter("execution")
        try:
            result = self.server.app.handle(req)
        except ZeroserveError as exc:
            result = error_response(exc, req.route.errors, self._request_id())
        except Exception:
            log.exception("unhandled error in %s %s", req.method, req.path)
            result = internal_error(req.route.errors, self._request_id())
        if type(result) is Response:  # the common case first: a whole response, now
            return self._send(req, result)
        if isinstance(result, StreamResponse):
            # The head and the first ready pieces leave now, from this I/O callback, not
            # behind the batches of the streams already queued on the loop.
            started = self._stream_writer().start(req, result)
            task = self.task = self.loop.create_task(self._run(req, result, started))
            task.add_done_callback(lambda t: self._release_request(req) if t.cancelled() else None)
            return None
        if inspect.isawaitable(result):
            task = self.task = self.loop.create_task(self._run(req, result))
            # A task cancelled before its first step never enters _run's handlers.
            task.add_done_callback(lambda t: self._release_request(req) if t.cancelled() else None)
            return None
        return self._send(req, result)

    def _stream_writer(self) -> StreamWriter:
        writer = self._writer
        if writer is None:
            writer = self._writer = StreamWriter(self.loop, self.flow, self.conn, self.server)
        return writer

    async def _run(self, req: Request, pending: HandlerResult, started: bool = False) -> None:
        """Run a handler's awaitable, or write a stream (``started``: its head and first
        pieces were sent by ``StreamWriter.start``)."""
        fmt = req.route.errors
        try:
            try:
                result = await pending if inspect.isawaitable(pending) else pending
            except ZeroserveError as exc:
                result = error_response(exc, fmt, self._request_id())
            if isinstance(result, StreamResponse):
                answer = await self._stream_writer().respond(req, result, started=started)
                if answer is not None:  # the stream failed before its head was sent
                    self._write_response(answer, req.route.name)
                nxt = self._finish(req)
            else:
                nxt = self._send(req, result)
        except asyncio.CancelledError:
            raise  # the task's done callback releases the request (see _dispatch)
        except (ConnectionError, OSError):
            self._release_request(req)
            self._abort()
            return
        except Exception:
            log.exception("unhandled error in %s %s", req.method, req.path)
            if self.request is req and not self.flow.closed:
                nxt = self._send(req, internal_error(fmt, self._request_id()))
            else:
                if self.request is req:
                    self._release_request(req)
                return
        finally:
            self.task = None
        self._drive(nxt)

    def _send(self, req: Request, resp: Response) -> RequestHead | BodyComplete | None:
        transport = self.transport
        if transport is None or self.flow.closed:
            self._release_request(req)
            return None
        # _write_response, inlined: this is the path of every fixed response.
        body = resp.body
        size = framing.buffers_size(body)
        conn = self.conn
        ctx = self._ctx
        headers = resp.headers if ctx is None else ctx.response_headers(resp.headers)
        head = conn.start_response(
            resp.status, headers, content_length=size, draining=self.server.draining
        )
        if not conn.body_allowed or not size:
            transport.write(head)
            size = 0
        else:
            transport.writelines([head, *body])
            metrics.count_payload("out", size)
        if ctx is not None:
            ctx.status, ctx.bytes_out = resp.status, size
        self.flow.release_after_drain(resp.release)
        metrics.count_request(req.route.name, resp.status)
        return self._finish(req)

    def _write_response(self, resp: Response, route: str) -> None:
        """Write a whole response (its head from the connection); its releases run once
        the transport has sent it."""
        transport = self.transport
        assert transport is not None
        body = resp.body
        size = framing.buffers_size(body)
        conn = self.conn
        ctx = self._ctx
        headers = resp.headers if ctx is None else ctx.response_headers(resp.headers)
        head = conn.start_response(
            resp.status, headers, content_length=size, draining=self.server.draining
        )
        if not conn.body_allowed or not size:
            transport.write(head)
            size = 0
        else:
            transport.writelines([head, *body])
            metrics.count_payload("out", size)
        if ctx is not None:
            ctx.status, ctx.bytes_out = resp.status, ctx.bytes_out + size
        self.flow.release_after_drain(resp.release)
        metrics.count_request(route, resp.status)

    def _finish(self, req: Request) -> RequestHead | BodyComplete | None:
        req.route.timer(self.loop.time() - self._started)
        self._edge_end(None, len(req.body))
        self.request = None
        self._responding = False
        # A ticket the handler never handed on goes back now; the body lease once the
        # response (which may be a view of it) has been sent.
        req.release(self.flow.release_one_after_drain)
        self.flow.schedule_releases()
        return self._end_response()

    def _end_response(self) -> RequestHead | BodyComplete | None:
        """Hand the end of the response to the connection; close or read on as it says."""
        transport = self.transport
        assert transport is not None
        conn = self.conn
        try:
            nxt = conn.end_response(draining=self.server.draining)
        except ProtocolError as exc:
            self._protocol_error(exc)
            return None
        if conn.state is State.CLOSED:
            transport.close()  # flushes what is queued, then closes
            return None
        if self._paused_reading:
            self._paused_reading = False
            transport.resume_reading()
        if nxt is None:
            if conn.state is State.DISCARD:
                self.deadline = self.loop.time() + self.server.options.body_timeout
            elif conn.idle:
                self.deadline = self.loop.time() + self.server.options.keepalive_timeout
                self.server.idle[self] = None
            else:
                self.deadline = self.loop.time() + self.server.options.head_timeout
        return nxt

    # -- errors -----------------------------------------------------------------------------
    def _early_error(
        self, head: RequestHead, exc: ZeroserveError
    ) -> RequestHead | BodyComplete | None:
        """Answer before the body is read (404, 413, 429, ...). Whether the connection
        survives (a small body is read and dropped) is the connection's decision."""
        fmt = self.server.app.error_format(head.path)
        return self._early_answer(error_response(exc, fmt, self._request_id()), "rejected")

    def _early_answer(self, resp: Response, outcome: Outcome) -> RequestHead | BodyComplete | None:
        """Answer at the head: an error, or a CORS preflight."""
        self._write_response(resp, "early")
        self._edge_end(outcome)
        self.flow.schedule_releases()
        self._started = self.loop.time()
        return self._end_response()

    def _protocol_error(self, exc: ProtocolError) -> None:
        transport = self.transport
        if transport is None or self.flow.closed:
            return
        if self._responding:
            # Bytes after a request we are still answering broke framing: just close.
            self._abort()
            return
        head = self.conn.head
        path = head.path if head is not None else exc.path
        fmt: ErrorFormat = self.server.app.error_format(path) if path is not None else "openai"
        if self.request is not None:  # the body was bad: the request never ran
            self._release_request(self.request)
            self.request = None
        ctx = self._ctx
        if ctx is None:  # a bad head: the answer still carries a request id
            ctx = self._ctx = self.edge.start("", ())
        resp = error_response(exc, fmt, ctx.request_id)
        size = framing.buffers_size(resp.body)
        out = self.conn.reject(resp.status, ctx.response_headers(resp.headers), size)
        transport.writelines([out, *resp.body])
        metrics.count_request("protocol_error", exc.status)
        ctx.status, ctx.bytes_out = exc.status, size
        self._edge_end("rejected")
        if self._sink is not None:
            self._sink.lease.release()
            self._sink = None
        transport.close()

    def _release_request(self, req: Request) -> None:
        """The request ends without a response being sent: return what it owns now."""
        if self.request is req:
            self.request = None
        req.release()

    def _pause_reading(self) -> None:
        if not self._paused_reading and self.transport is not None:
            self._paused_reading = True
            self.transport.pause_reading()

    def _abort(self) -> None:
        abort(self.flow, self.conn)

    # -- the edge -----------------------------------------------------------------------------
    def _request_id(self) -> bytes:
        ctx = self._ctx
        return ctx.request_id if ctx is not None else b""

    def _edge_end(self, outcome: Outcome | None, bytes_in: int = 0) -> None:
        """The current request ended: the edge releases its key's quota and logs it."""
        ctx, self._ctx = self._ctx, None
        head, self._head = self._head, None
        edge = self.edge
        if ctx is None or not edge.needs_end:
            return
        if not edge.records:  # keys alone: only the key's quota to release
            edge.release_quota(ctx)
            return
        method, path = (head.method, head.path) if head is not None else ("", "")
        edge.finish(ctx, EdgeEnd(method, path, outcome, bytes_in))

    # -- server hooks ---------------------------------------------------------------------------
    def check_timeout(self, now: float) -> None:
        if self.deadline and now > self.deadline:
            log.debug("connection timed out in state %s", self.conn.state)
            if self.conn.state is State.HEAD and self.conn.buffered and self.transport is not None:
                self._protocol_error(ProtocolError("request head timeout", status=408))
                return
            self._abort()
        elif self.flow.paused and now - self.flow.paused_since > self.server.options.write_timeout:
            self._abort()

    def close_if_idle(self) -> bool:
        """Close between requests (for drain, or to admit a new connection); queued
        response bytes are still sent. False if the connection is not idle."""
        if (
            self.conn.idle
            and self.request is None
            and self.task is None
            and self.transport is not None
            and not self.flow.closed
        ):
            self.transport.close()
            return True
        return False
