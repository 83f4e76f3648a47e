"""One in-thread launcher: the real stack (``Arena``, ``Engine``, ``App`` with an optional
``Edge``, ``Server``) on its own event loop in a background thread, bound to a free loopback
port, with TLS when the options ask for it.

Tests talk to it over real sockets (the official SDKs, httpx, raw sockets) exactly as a
remote client would, and may also run a coroutine on its loop to read engine state
(``call``), which a subprocess server cannot offer. The edge is built by the test, so quotas
can run on an injected clock.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Coroutine, Mapping
from typing import Any, TypeVar

import uvloop

from tests.support.clients import OpenAIClients
from tests.support.timing import scaled
from zeroserve.app import App
from zeroserve.edge import Edge
from zeroserve.http.limits import HttpLimits
from zeroserve.runtime import Arena, Engine, ModelConfig, RuntimeOptions
from zeroserve.server.options import ServerOptions
from zeroserve.server.server import Server, bind_socket

T = TypeVar("T")

# Quiet-machine bounds, scaled: a server that does not come up (or go down) in this long has
# failed, not slowed down.
START_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 30.0
ARENA_BYTES = 256 << 20
LOOPS: dict[str, Callable[[], asyncio.AbstractEventLoop]] = {
    "uvloop": uvloop.new_event_loop,
    "asyncio": asyncio.new_event_loop,
}


class ServerThread(OpenAIClients):
    """One real server on ``127.0.0.1:<free port>`` in a thread with its own loop.

    ``options`` are the server's (TLS, timeouts); ``limits`` is a shorthand for
    ``ServerOptions(http=limits)`` and cannot be given with them.
    """

    def __init__(
        self,
        configs: Mapping[str, ModelConfig],
        *,
        edge: Edge | None = None,
        options: ServerOptions | None = None,
        limits: HttpLimits | None = None,
        runtime: RuntimeOptions | None = None,
        loop: str = "uvloop",
        arena_bytes: int = ARENA_BYTES,
    ) -> None:
        if options is not None and limits is not None:
            raise ValueError("give the HTTP limits inside options, not beside them")
        self.configs = dict(configs)
        self.edge = edge
        self.options = options or ServerOptions(port=0, http=limits or HttpLimits())
        self.runtime = runtime
        self.loop_kind = loop
        self.arena_bytes = arena_bytes
        self.loop: asyncio.AbstractEventLoop | None = None
        self.engine: Engine | None = None
        self.server: Server | None = None
        self.port = 0
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._main, name="zeroserve-test", daemon=True)

    @property
    def url(self) -> str:
        scheme = "https" if self.options.tls is not None else "http"
        return f"{scheme}://127.0.0.1:{self.port}"

    def start(self) -> ServerThread:
        self._thread.start()
        if not self._ready.wait(scaled(START_TIMEOUT_S)):
            raise RuntimeError("test server did not start")
        if self._error is not None:
            raise self._error
        return self

    def _main(self) -> None:
        with asyncio.Runner(loop_factory=LOOPS[self.loop_kind]) as runner:
            try:
                runner.run(self._serve())
            except BaseException as exc:  # reported by start()
                self._error = exc
                self._ready.set()

    async def _serve(self) -> None:
        self.loop = asyncio.get_running_loop()
        arena = Arena(self.arena_bytes)
        engine = self.engine = Engine(self.configs, arena=arena, options=self.runtime)
        app: App | None = None
        try:
            await engine.start()
            app = App(engine, self.edge)
            server = self.server = Server(app, arena, self.options)
            await server.start(bind_socket("127.0.0.1", 0))
            self.port = server.port
            self._ready.set()
            await server.wait_stopped()
        finally:
            if app is not None:
                await app.aclose()
            await engine.aclose()
            arena.close()

    def call_soon(self, fn: Callable[[], object]) -> None:
        """Run ``fn`` on the server's loop (as a callback, without waiting for it)."""
        assert self.loop is not None
        self.loop.call_soon_threadsafe(fn)

    def call(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run ``coro`` on the server's loop (to read engine state) and return its result."""
        assert self.loop is not None
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(scaled(STOP_TIMEOUT_S))

    def in_flight(self, model: str) -> int:
        """Requests of ``model`` that hold a ticket now."""

        async def read() -> int:
            assert self.engine is not None
            return self.engine.model(model).statistics().queue.in_flight

        return self.call(read())

    def stop(self) -> None:
        """Drain and stop the server, skipping the drain's ready delay; fail if its thread
        is still alive after the (scaled) stop bound."""
        server = self.server
        loop = self.loop
        if loop is not None and server is not None:

            def shutdown_now() -> None:
                # Both requests from one callback on the server's loop: the first starts
                # the drain (or, if a test already started one, ends its ready delay);
                # the second, queued behind the drain task's first step, skips the ready
                # delay. Sent as two calls from this thread, the first could stop the
                # server and close its loop before the second arrived.
                server.request_shutdown()
                loop.call_soon(server.request_shutdown)

            self.call_soon(shutdown_now)
        self._thread.join(scaled(STOP_TIMEOUT_S))
        assert not self._thread.is_alive(), "server did not stop"
