"""Real servers over loopback for the OpenAI suite (fixtures in ``conftest.py``).

Each server is the real stack (``Arena``, ``Engine``, ``App``, ``Server``) running its
own event loop in a background thread, bound to a free port; tests talk to it with the
official ``openai`` SDK, httpx and httpx-sse, exactly as a remote client would.

* ``server``: the default models (``echo``, ``tinyllm``, ``minilm``), ``tinyllm`` again on
  the ``inline`` executor, and the test models of ``models_for_tests``.
  One per session (loading takes about a second).
* ``process_server``: ``tinyllm`` on the ``process`` executor.
* ``strict_server``: a 0.5 s request deadline and a 64 KiB body limit, on plain asyncio,
  for the 504 and 413 paths.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Coroutine, Mapping
from typing import Any, TypeVar

import uvloop
from openai_test_models import EndlessModel, FailingModel, GatedModel, StallModel

import openai
from zeroserve.app import App
from zeroserve.edge import Edge, EdgeOptions
from zeroserve.http.limits import HttpLimits
from zeroserve.models.echo import EchoModel
from zeroserve.models.minilm import MiniLMEmbedder
from zeroserve.models.tinyllm import TinyLlamaModel
from zeroserve.runtime import Arena, Engine, ModelConfig, RuntimeOptions
from zeroserve.server.options import ServerOptions
from zeroserve.server.server import Server, bind_socket

T = TypeVar("T")

# A server that does not come up (or go down) in this long has failed, not slowed down.
START_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 30.0
# The strict server: requests die after half a second, bodies over 64 KiB get 413.
STRICT_DEADLINE_S = 0.5
STRICT_MAX_BODY_BYTES = 64 * 1024


class ServerThread:
    """One real server on ``127.0.0.1:<free port>`` in a thread with its own loop."""

    def __init__(
        self,
        configs: Mapping[str, ModelConfig],
        *,
        runtime: RuntimeOptions | None = None,
        limits: HttpLimits | None = None,
        loop: str = "uvloop",
        edge: EdgeOptions | None = None,
    ) -> None:
        self.configs = dict(configs)
        self.edge = edge
        self.runtime = runtime
        self.limits = limits or HttpLimits()
        self.loop_kind = loop
        self.loop: asyncio.AbstractEventLoop | None = None
        self.engine: Engine | None = None
        self.server: Server | None = None
        self.port = 0
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._main, name="zeroserve-test", daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> ServerThread:
        self._thread.start()
        if not self._ready.wait(START_TIMEOUT_S):
            raise RuntimeError("test server did not start")
        if self._error is not None:
            raise self._error
        return self

    def _main(self) -> None:
        factory = uvloop.new_event_loop if self.loop_kind == "uvloop" else asyncio.new_event_loop
        with asyncio.Runner(loop_factory=factory) as runner:
            try:
                runner.run(self._serve())
            except BaseException as exc:  # reported by start()
                self._error = exc
                self._ready.set()

    async def _serve(self) -> None:
        self.loop = asyncio.get_running_loop()
        arena = Arena(256 << 20)
        engine = self.engine = Engine(self.configs, arena=arena, options=self.runtime)
        edge = Edge(self.edge) if self.edge is not None else None
        try:
            await engine.start()
            options = ServerOptions(port=0, http=self.limits)
            server = self.server = Server(App(engine, edge), arena, options)
            await server.start(bind_socket("127.0.0.1", 0))
            self.port = server.port
            self._ready.set()
            await server.wait_stopped()
        finally:
            await engine.aclose()
            arena.close()
            if edge is not None:
                edge.close()

    def call(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run ``coro`` on the server's loop (to read engine state) and return its result."""
        assert self.loop is not None
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(STOP_TIMEOUT_S)

    def in_flight(self, model: str) -> int:
        async def read() -> int:
            assert self.engine is not None
            return self.engine.model(model).statistics().queue.in_flight

        return self.call(read())

    def stop(self) -> None:
        if self.loop is not None and self.server is not None:
            server = self.server
            asyncio.run_coroutine_threadsafe(server.shutdown(), self.loop).result(STOP_TIMEOUT_S)
        self._thread.join(STOP_TIMEOUT_S)

    def client(self, **kw: Any) -> openai.OpenAI:
        return openai.OpenAI(base_url=self.url + "/v1", api_key="unused", max_retries=0, **kw)

    def async_client(self, **kw: Any) -> openai.AsyncOpenAI:
        return openai.AsyncOpenAI(base_url=self.url + "/v1", api_key="unused", max_retries=0, **kw)


def default_configs() -> dict[str, ModelConfig]:
    return {
        "echo": ModelConfig("echo", EchoModel),
        "tinyllm": ModelConfig("tinyllm", TinyLlamaModel),
        "minilm": ModelConfig("minilm", MiniLMEmbedder),
        "tinyllm-inline": ModelConfig("tinyllm-inline", TinyLlamaModel, executor="inline"),
        "gated": ModelConfig("gated", GatedModel),
        "endless": ModelConfig("endless", EndlessModel, queue_depth=1),
        "failing": ModelConfig("failing", FailingModel),
    }


def process_configs() -> dict[str, ModelConfig]:
    """tinyllm on a process worker (its own server, so only its tests depend on it)."""
    return {"tinyllm-process": ModelConfig("tinyllm-process", TinyLlamaModel, executor="process")}


def strict_configs() -> dict[str, ModelConfig]:
    return {"echo": ModelConfig("echo", EchoModel), "stall": ModelConfig("stall", StallModel)}


def run(coro: Coroutine[Any, Any, T]) -> T:
    """Run an async test body (the async SDK) on a fresh loop in the test thread."""
    return asyncio.run(asyncio.wait_for(coro, 60))
