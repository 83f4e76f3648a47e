"""Listening, timeouts, signals and graceful drain for one HTTP process."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import socket

from .. import metrics
from ..runtime.arena import Arena
from .connection import HttpProtocol, busy_answer
from .hosted import HostedApp
from .options import ServerOptions
from .tls import server_context
from .turns import Turns

log = logging.getLogger("zeroserve.server")


class Server:
    """Serves ``app`` (a :class:`~.hosted.HostedApp`) on ``options.host:options.port``,
    the request bodies received into leases of ``arena``."""

    def __init__(self, app: HostedApp, arena: Arena, options: ServerOptions | None = None) -> None:
        self.app = app
        self.arena = arena
        self.busy = busy_answer(app)  # the answer past max_connections, made once
        self.options = options or ServerOptions()
        self.connections: set[HttpProtocol] = set()
        # The keep-alive connections idle between requests, longest-idle first (insertion
        # order): a connection joins when its response ends, leaves with its next byte.
        self.idle: dict[HttpProtocol, None] = {}
        self.evicted = 0  # idle connections closed to admit a new one at max_connections
        # draining: SIGTERM seen, /ready answers 503, responses close their connections;
        # closing: the listener is closed (after options.drain_ready_delay), new
        # connections are refused.
        self.draining = False
        self.closing = False
        self.tls = self.options.tls is not None
        self.loop: asyncio.AbstractEventLoop = asyncio.get_event_loop()
        # The streams' shared turn of each loop iteration (server/turns.py).
        self.turns = Turns(self.loop, self.options.turn_budget_s)
        self._server: asyncio.base_events.Server | None = None
        self._ticker: asyncio.TimerHandle | None = None
        self._lag_probe: asyncio.TimerHandle | None = None
        self._stopped = asyncio.Event()
        self._hurry = asyncio.Event()  # a second SIGTERM: stop waiting for the LB
        self.port = self.options.port

    async def start(self, sock: socket.socket | None = None) -> None:
        self.loop = self.turns.loop = asyncio.get_running_loop()
        if sock is None:
            sock = bind_socket(
                self.options.host, self.options.port, reuse_port=self.options.reuse_port
            )
        tls = self.options.tls
        if tls is None:
            self._server = await self.loop.create_server(
                lambda: HttpProtocol(self), sock=sock, backlog=self.options.backlog
            )
        else:
            self._server = await self.loop.create_server(
                lambda: HttpProtocol(self),
                sock=sock,
                backlog=self.options.backlog,
                ssl=server_context(tls),
                ssl_handshake_timeout=self.options.head_timeout,
            )
        self.port = sock.getsockname()[1]
        self._ticker = self.loop.call_later(self.options.tick, self._tick)
        self._probe_lag()
        metrics.register_source(
            "connections",
            lambda: {"open": len(self.connections), "evicted": self.evicted},
            counters=("evicted",),
        )

    def evict_idle(self) -> bool:
        """Close the longest-idle keep-alive connection, making room for a new one; False
        when none is idle."""
        while self.idle:
            conn = next(iter(self.idle))
            del self.idle[conn]
            if conn.close_if_idle():
                self.connections.discard(conn)  # gone now; connection_lost follows
                self.evicted += 1
                return True
        return False

    def _tick(self) -> None:
        now = self.loop.time()
        for conn in list(self.connections):
            conn.check_timeout(now)
        self._ticker = self.loop.call_later(self.options.tick, self._tick)

    def _probe_lag(self) -> None:
        # How late a timer due "now + 0.1 s" actually fires: the event-loop stall.
        due = self.loop.time() + 0.1

        def fire() -> None:
            metrics.LOOP_LAG_SECONDS.observe(max(0.0, self.loop.time() - due))
            self._probe_lag()

        self._lag_probe = self.loop.call_at(due, fire)

    def install_signal_handlers(self) -> None:
        for sig in (signal.SIGTERM, signal.SIGINT):
            with contextlib.suppress(NotImplementedError, RuntimeError):
                self.loop.add_signal_handler(sig, self.request_shutdown)

    def request_shutdown(self) -> None:
        """SIGTERM: drain. A second one skips what is left of the ready delay."""
        if not self.draining:
            log.info("shutting down: draining in-flight requests")
            self.loop.create_task(self.shutdown())
        else:
            self._hurry.set()

    async def shutdown(self) -> None:
        """Turn not-ready, keep accepting for ``drain_ready_delay`` (so a load balancer
        stops sending first), stop accepting, let in-flight requests finish within the
        grace period, close."""
        if self.draining:
            await self._stopped.wait()
            return
        self.draining = True
        self.app.start_draining()  # /ready answers 503 from now on
        deadline = self.loop.time() + self.options.graceful_timeout
        if self.options.drain_ready_delay > 0:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._hurry.wait(), self.options.drain_ready_delay)
        self.closing = True
        if self._server is not None:
            self._server.close()
        # Idle connections are closed (a close flushes what is queued first); busy ones
        # finish their response, which then closes them. connection_lost removes each.
        while self.connections and self.loop.time() < deadline:
            for conn in list(self.connections):
                conn.close_if_idle()
            await asyncio.sleep(min(0.05, self.options.tick))
        for conn in list(self.connections):
            if conn.transport is not None:
                conn.transport.abort()
        self.connections.clear()
        if self._ticker is not None:
            self._ticker.cancel()
        if self._lag_probe is not None:
            self._lag_probe.cancel()
        metrics.unregister_source("connections")
        self._stopped.set()

    async def wait_stopped(self) -> None:
        await self._stopped.wait()


def bind_socket(host: str, port: int, *, reuse_port: bool = False) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    if reuse_port:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    sock.bind((host, port))
    sock.setblocking(False)
    sock.set_inheritable(True)
    return sock
