"""The server in the test's own process, on the test's own loop: for tests that need the
loop's order or the server's objects (``HttpProtocol``), not only its socket."""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from typing import Any

from zeroserve.app import App
from zeroserve.runtime import Arena, Engine, ModelConfig
from zeroserve.server.options import ServerOptions
from zeroserve.server.server import Server

ARENA_BYTES = 1 << 24


@asynccontextmanager
async def serving(models: Mapping[str, Any], options: ServerOptions) -> AsyncIterator[Server]:
    """A started server of ``models`` (name -> model class), shut down with its engine
    and arena on exit."""
    arena = Arena(ARENA_BYTES)
    engine = Engine(
        {name: ModelConfig(name=name, factory=factory) for name, factory in models.items()},
        arena=arena,
    )
    await engine.start()
    server = Server(App(engine), arena, options)
    await server.start()
    try:
        yield server
    finally:
        await server.shutdown()
        await engine.aclose()
        arena.close()
