"""One upstream: its pool of keep-alive connections, its passive health, its statistics.

Strategy
--------
Connections are ``asyncio.Protocol`` objects (``data_received`` hands over a fresh
``bytes`` per read, which the body views reference, so nothing is copied or recycled
under a view). At most ``connections`` exist per upstream, opening ones included; a
request that finds none idle and the limit reached waits (FIFO) for one, bounded by its
deadline. Idle connections are reused newest first (the warmest) and dropped once idle
for ``POOL_IDLE_S``, before typical upstream keep-alive timeouts close them under us.
A reused connection that dies before answering a byte was closed by the upstream while
idle: the request goes again, once, on a fresh connection (as urllib3 and aiohttp do).

A connection goes back to the pool only when its response was read to the end, the
upstream allows keep-alive, and our request was sent whole; anything else (client gone,
deadline, error, early answer) aborts it, so a half-read response never reaches the
next request, and the transport drops its references to the request's lease.

Health is passive: ``max_fails`` consecutive failures (refused or reset before an
answer, a 5xx head, a timeout, a stream cut short) eject the upstream for ``eject_s``.
Afterwards it is tried again, and its failure count is kept until a success resets it,
so one more failure ejects it again at once (half-open, as Envoy's outlier detection).
"""

from __future__ import annotations

import asyncio
import ssl
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from ..errors import DeadlineExceeded, ProtocolError, UpstreamError, UpstreamUnreachable
from ..http.client import ResponseHead, ResponseReader
from ..models.remote import RemoteOptions, UpstreamURL
from .exchange import Exchange

Buffer = bytes | bytearray | memoryview

# Seconds an idle keep-alive connection is kept. Below the common upstream keep-alive
# timeouts (uvicorn, hence vLLM, and zeroserve: 5 s) so we close first, not the upstream
# while a request is being written.
POOL_IDLE_S = 4.0


@dataclass(frozen=True, slots=True)
class UpstreamStatistics:
    url: str
    requests: int  # exchanges started
    errors: int  # failures (see the module docstring)
    in_flight: int  # requests assigned to this upstream now
    ejected: bool
    ejections: int
    consecutive_failures: int
    connections: int  # open (or opening) now
    idle: int
    connects: int  # connections opened so far
    reused: int  # exchanges on a reused connection
    waiting: int  # requests waiting for a free connection
    pending_bytes: int  # response bytes held for clients now
    peak_pending_bytes: int  # most held for one exchange, ever
    read_pauses: int  # times reading paused for a slow client
    batches: int  # client writes handed out
    coalesced: int  # of which joined more than one upstream read


class UpstreamConnection(asyncio.Protocol):
    """One HTTP/1.1 connection to an upstream; one exchange at a time."""

    def __init__(self, upstream: Upstream) -> None:
        self.upstream = upstream
        self.transport: asyncio.Transport | None = None
        self.reader = ResponseReader()
        self.exchange: Exchange[UpstreamConnection] | None = None
        self.closed = False
        self.counted = False  # counted in upstream.open
        self.uses = 0
        self.idle_since = 0.0
        self._reading_paused = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        ex = self.exchange
        if ex is None:
            self.abort()  # bytes while idle: the upstream is confused; drop it
            return
        try:
            views = self.reader.feed(data)
        except ProtocolError as exc:
            ex.fail(
                UpstreamError(f"upstream {self.upstream.url.url} sent an invalid response: {exc}")
            )
            self.abort()
            return
        head = self.reader.head
        if head is not None and not ex.head.done():
            ex.on_head(head)
        if views:
            ex.on_data(views)
        if self.reader.done:
            ex.on_end()

    def eof_received(self) -> bool | None:
        ex = self.exchange
        if ex is not None and self.reader.head is not None and self.reader.feed_eof():
            ex.on_end()
        return None  # close

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self.upstream._lost(self)
        ex = self.exchange
        if ex is not None:
            ex.fail(self._lost_error())

    def _lost_error(self) -> UpstreamError:
        url = self.upstream.url.url
        if self.reader.received == 0:
            return UpstreamUnreachable(f"upstream {url} closed the connection without answering")
        return UpstreamError(f"upstream {url} closed the connection mid-response")

    def start(self, ex: Exchange[UpstreamConnection], method: str) -> None:
        self.exchange = ex
        self.reader.start(method)
        self.uses += 1

    def write(self, buffers: Sequence[Buffer]) -> None:
        assert self.transport is not None
        self.transport.writelines(buffers)

    def pause_reading(self) -> None:
        if not self.closed and not self._reading_paused and self.transport is not None:
            self._reading_paused = True
            self.transport.pause_reading()

    def resume_reading(self) -> None:
        if not self.closed and self._reading_paused and self.transport is not None:
            self._reading_paused = False
            self.transport.resume_reading()

    def abort(self) -> None:
        if not self.closed:
            self.closed = True
            if self.transport is not None:
                self.transport.abort()
        self.upstream._lost(self)

    def sent_all(self) -> bool:
        return self.transport is not None and self.transport.get_write_buffer_size() == 0


class Upstream:
    def __init__(
        self,
        url: UpstreamURL,
        options: RemoteOptions,
        clock: Callable[[], float] = time.monotonic,
        ssl_context: ssl.SSLContext | None = None,
    ) -> None:
        self.url = url
        self.options = options
        self.clock = clock
        self.ssl = ssl_context if url.tls else None
        self.idle: list[UpstreamConnection] = []
        self.open = 0
        self._waiters: deque[asyncio.Future[None]] = deque()
        self.in_flight = 0
        self.fails = 0
        self.ejected_until = 0.0
        self.ejections = 0
        self.requests = 0
        self.errors = 0
        self.connects = 0
        self.reused = 0
        self.peak_pending_bytes = 0
        self.read_pauses = 0
        self.batches = 0
        self.coalesced = 0
        self.exchanges: set[Exchange[UpstreamConnection]] = set()
        self._closed = False

    # -- health ---------------------------------------------------------------------------
    def healthy(self, now: float) -> bool:
        return now >= self.ejected_until

    def record_success(self) -> None:
        self.fails = 0

    def record_failure(self) -> None:
        self.errors += 1
        self.fails += 1
        now = self.clock()
        if self.fails >= self.options.max_fails and now >= self.ejected_until:
            self.ejected_until = now + self.options.eject_s
            self.ejections += 1

    # -- exchanges ------------------------------------------------------------------------
    async def exchange(
        self, method: str, buffers: Sequence[Buffer], deadline: float
    ) -> tuple[Exchange[UpstreamConnection], ResponseHead, float]:
        """Send one request (``buffers``: head then body) and wait for the response head.
        Returns the exchange, its head and the ``perf_counter`` time the request was
        handed to the transport. The caller must ``finish()`` the exchange."""
        loop = asyncio.get_running_loop()
        fresh = False
        while True:
            self.in_flight += 1
            try:
                conn = await self._acquire(loop, deadline, fresh)
            except BaseException:
                self.in_flight -= 1
                raise
            reused = conn.uses > 0
            ex = Exchange(conn, self.options.queue_bytes, self._finished)
            self.exchanges.add(ex)
            self.requests += 1
            self.reused += reused
            conn.start(ex, method)
            conn.write(buffers)
            written = time.perf_counter()
            ex.timers.append(loop.call_at(deadline, self._expire, ex))
            first_byte = loop.time() + self.options.first_byte_timeout
            if first_byte < deadline:
                ex.timers.append(loop.call_at(first_byte, self._expire_head, ex))
            try:
                head = await ex.head
            except UpstreamUnreachable:
                ex.finish(False)
                if reused and not fresh:
                    fresh = True  # closed while idle, most likely: once more, on a new one
                    continue
                raise
            except BaseException:
                ex.finish(False)
                raise
            return ex, head, written

    def _expire(self, ex: Exchange[UpstreamConnection]) -> None:
        ex.fail(DeadlineExceeded(f"the upstream {self.url.url} did not finish before the deadline"))
        ex.conn.abort()

    def _expire_head(self, ex: Exchange[UpstreamConnection]) -> None:
        if not ex.head.done():
            ex.fail(
                DeadlineExceeded(
                    f"the upstream {self.url.url} sent no response head within "
                    f"{self.options.first_byte_timeout} s"
                )
            )
            ex.conn.abort()

    def _finished(self, ex: Exchange[UpstreamConnection], ok: bool) -> None:
        self.in_flight -= 1
        self.exchanges.discard(ex)
        if ex.peak_pending_bytes > self.peak_pending_bytes:
            self.peak_pending_bytes = ex.peak_pending_bytes
        self.read_pauses += ex.pauses
        self.batches += ex.batches
        self.coalesced += ex.coalesced
        conn = ex.conn
        conn.exchange = None
        head = conn.reader.head
        if (
            ok
            and head is not None
            and head.keep_alive
            and not conn.closed
            and conn.sent_all()
            and not self._closed
        ):
            conn.resume_reading()
            conn.idle_since = asyncio.get_running_loop().time()
            self.idle.append(conn)
            self._wake_one()
        else:
            conn.abort()

    # -- the pool -------------------------------------------------------------------------
    async def _acquire(
        self, loop: asyncio.AbstractEventLoop, deadline: float, fresh: bool
    ) -> UpstreamConnection:
        while True:
            if not fresh:
                now = loop.time()
                while self.idle:
                    conn = self.idle.pop()
                    if conn.closed:
                        continue
                    if now - conn.idle_since > POOL_IDLE_S:
                        conn.abort()
                        continue
                    return conn
            if self.open < self.options.connections:
                return await self._connect(loop, deadline)
            if fresh and self.idle:
                self.idle.pop(0).abort()  # make room for the fresh connection
                continue
            waiter: asyncio.Future[None] = loop.create_future()
            self._waiters.append(waiter)
            try:
                async with asyncio.timeout_at(deadline):
                    await waiter
            except BaseException as exc:
                if waiter.done() and not waiter.cancelled():
                    self._wake_one()  # woken but leaving: pass the free slot on
                if isinstance(exc, TimeoutError):
                    raise DeadlineExceeded(
                        f"no connection to the upstream {self.url.url} came free before the deadline"
                    ) from None
                raise
            finally:
                if waiter in self._waiters:
                    self._waiters.remove(waiter)

    async def _connect(
        self, loop: asyncio.AbstractEventLoop, deadline: float
    ) -> UpstreamConnection:
        self.open += 1
        limit = loop.time() + self.options.connect_timeout
        try:
            async with asyncio.timeout_at(min(limit, deadline)):
                _, conn = await loop.create_connection(
                    lambda: UpstreamConnection(self),
                    self.url.host,
                    self.url.port,
                    ssl=self.ssl,
                    server_hostname=self.url.host if self.ssl else None,
                )
        except TimeoutError:
            self._uncount()
            if limit >= deadline:
                raise DeadlineExceeded(
                    f"connecting to the upstream {self.url.url} outlasted the deadline"
                ) from None
            raise UpstreamUnreachable(
                f"connecting to the upstream {self.url.url} timed out "
                f"({self.options.connect_timeout} s)"
            ) from None
        except OSError as exc:
            self._uncount()
            raise UpstreamUnreachable(
                f"cannot connect to the upstream {self.url.url}: {exc.strerror or exc}"
            ) from None
        except BaseException:
            self._uncount()
            raise
        self.connects += 1
        if conn.closed or self._closed:
            self._uncount()
            conn.abort()
            raise UpstreamUnreachable(f"the upstream {self.url.url} closed the connection at once")
        conn.counted = True
        return conn

    def _uncount(self) -> None:
        self.open -= 1
        self._wake_one()

    def _lost(self, conn: UpstreamConnection) -> None:
        if conn.counted:
            conn.counted = False
            self.open -= 1
            if conn in self.idle:
                self.idle.remove(conn)
            self._wake_one()

    def _wake_one(self) -> None:
        while self._waiters:
            w = self._waiters.popleft()
            if not w.done():
                w.set_result(None)
                return

    async def aclose(self) -> None:
        """Close every connection, in use or idle (in-flight exchanges fail)."""
        self._closed = True
        for ex in list(self.exchanges):
            ex.fail(UpstreamError("the relay is closing"))
            ex.conn.abort()
        for conn in list(self.idle):
            conn.abort()
        self.idle.clear()

    def statistics(self) -> UpstreamStatistics:
        now = self.clock()
        return UpstreamStatistics(
            url=self.url.url,
            requests=self.requests,
            errors=self.errors,
            in_flight=self.in_flight,
            ejected=not self.healthy(now),
            ejections=self.ejections,
            consecutive_failures=self.fails,
            connections=self.open,
            idle=len(self.idle),
            connects=self.connects,
            reused=self.reused,
            waiting=len(self._waiters),
            pending_bytes=sum(ex.pending_bytes for ex in self.exchanges),
            peak_pending_bytes=max(
                [self.peak_pending_bytes, *(ex.peak_pending_bytes for ex in self.exchanges)]
            ),
            read_pauses=self.read_pauses + sum(ex.pauses for ex in self.exchanges),
            batches=self.batches,
            coalesced=self.coalesced,
        )
