"""Real servers for the edge tests: the whole stack (Arena, Engine, App with an Edge,
Server) on its own loop in a background thread, on a free loopback port, with TLS when
asked. The Edge is built by the test, so quotas can run on an injected clock."""

from __future__ import annotations

import asyncio
import io
import ssl
import subprocess
import threading
from collections.abc import Coroutine, Mapping
from pathlib import Path
from typing import Any, TypeVar

import httpx
import uvloop

import openai
from zeroserve.app import App
from zeroserve.edge import Edge
from zeroserve.runtime import Arena, Engine, ModelConfig
from zeroserve.server.options import ServerOptions
from zeroserve.server.server import Server, bind_socket

T = TypeVar("T")

START_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 30.0


class ManualClock:
    """The edge's clock, moved by the test (quotas refill only when it says so)."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class EdgeServer:
    def __init__(
        self,
        configs: Mapping[str, ModelConfig],
        edge: Edge,
        options: ServerOptions | None = None,
    ) -> None:
        self.configs = dict(configs)
        self.edge = edge
        self.options = options or ServerOptions(port=0)
        self.loop: asyncio.AbstractEventLoop | None = None
        self.server: Server | None = None
        self.port = 0
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._main, name="zeroserve-edge-test", daemon=True)

    @property
    def url(self) -> str:
        scheme = "https" if self.options.tls is not None else "http"
        return f"{scheme}://127.0.0.1:{self.port}"

    def start(self) -> EdgeServer:
        self._thread.start()
        if not self._ready.wait(START_TIMEOUT_S):
            raise RuntimeError("test server did not start")
        if self._error is not None:
            raise self._error
        return self

    def _main(self) -> None:
        with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
            try:
                runner.run(self._serve())
            except BaseException as exc:
                self._error = exc
                self._ready.set()

    async def _serve(self) -> None:
        self.loop = asyncio.get_running_loop()
        arena = Arena(64 << 20)
        engine = Engine(self.configs, arena=arena)
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

    def call_soon(self, fn: Any) -> None:
        assert self.loop is not None
        self.loop.call_soon_threadsafe(fn)

    def call(self, coro: Coroutine[Any, Any, T]) -> T:
        assert self.loop is not None
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(STOP_TIMEOUT_S)

    def stop(self) -> None:
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
        self._thread.join(STOP_TIMEOUT_S)
        assert not self._thread.is_alive(), "server did not stop"

    def client(self, api_key: str = "unused", **kw: Any) -> openai.OpenAI:
        return openai.OpenAI(base_url=self.url + "/v1", api_key=api_key, max_retries=0, **kw)


class LogSink(io.BytesIO):
    """An access-log stream that wakes a waiting test whenever the writer thread writes."""

    def __init__(self) -> None:
        super().__init__()
        self.written = threading.Condition()

    def write(self, b: Any) -> int:
        with self.written:
            n = super().write(b)
            self.written.notify_all()
            return n

    def wait_for_text(self, needle: bytes, timeout: float = START_TIMEOUT_S) -> bytes:
        with self.written:
            assert self.written.wait_for(lambda: needle in self.getvalue(), timeout), needle
            return self.getvalue()


class Certs:
    """A self-signed CA-less certificate for 127.0.0.1, made with the openssl CLI."""

    def __init__(self, directory: Path) -> None:
        self.cert = directory / "cert.pem"
        self.key = directory / "key.pem"
        subprocess.run(
            [
                "openssl",
                "req",
                "-x509",
                "-newkey",
                "rsa:2048",
                "-nodes",
                "-days",
                "1",
                "-keyout",
                str(self.key),
                "-out",
                str(self.cert),
                "-subj",
                "/CN=127.0.0.1",
                "-addext",
                "subjectAltName=IP:127.0.0.1,DNS:localhost",
            ],
            check=True,
            capture_output=True,
            timeout=60,
        )

    def client_context(self) -> ssl.SSLContext:
        return ssl.create_default_context(cafile=str(self.cert))

    def httpx(self, **kw: Any) -> httpx.Client:
        return httpx.Client(verify=self.client_context(), **kw)
