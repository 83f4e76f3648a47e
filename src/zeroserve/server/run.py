"""Process entry: build arena, engine, app and server; run the loop; supervise workers."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import subprocess
import sys
from typing import TYPE_CHECKING, Any

from ..app import App
from ..runtime import Arena, Engine, ModelConfig
from .server import Server

if TYPE_CHECKING:
    from ..config import Config
    from ..models.loader import ModelSpec

log = logging.getLogger("zeroserve")

_CHILD_ENV = "ZEROSERVE_INTERNAL_CHILD"


def engine_configs(specs: list[ModelSpec]) -> dict[str, ModelConfig]:
    out: dict[str, ModelConfig] = {}
    for spec in specs:
        out[spec.name] = ModelConfig(
            name=spec.name, factory=spec.load_class(), options=spec.options, **spec.runtime
        )
    return out


async def serve_async(cfg: Config, specs: list[ModelSpec], *, ready: Any = None) -> None:
    arena = Arena(cfg.arena_bytes)
    engine = Engine(engine_configs(specs), arena=arena)
    try:
        await engine.start()
        server = Server(App(engine), arena, cfg.server_options())
        await server.start()
        server.install_signal_handlers()
        names = ", ".join(engine.names())
        print(f"zeroserve {os.getpid()} serving [{names}] on http://{cfg.host}:{server.port}", flush=True)
        if ready is not None:
            ready(server)
        await server.wait_stopped()
    finally:
        await engine.aclose()
        arena.close()


def run_loop(cfg: Config, coro: Any) -> None:
    use_uvloop = cfg.loop in ("auto", "uvloop")
    if use_uvloop:
        try:
            import uvloop
        except ImportError:
            if cfg.loop == "uvloop":
                raise
            use_uvloop = False
    if use_uvloop:
        uvloop.run(coro)
    else:
        asyncio.run(coro)


def serve(cfg: Config, specs: list[ModelSpec]) -> int:
    if cfg.workers > 1 and not os.environ.get(_CHILD_ENV):
        return _supervise(cfg)
    run_loop(cfg, serve_async(cfg, specs))
    return 0


def _supervise(cfg: Config) -> int:
    """Run ``cfg.workers`` HTTP processes sharing the port through SO_REUSEPORT. Each
    child is this same command; signals are forwarded and the parent waits for all."""
    env = dict(os.environ, **{_CHILD_ENV: "1"})
    argv = [sys.executable, "-m", "zeroserve", *sys.argv[1:]]
    children = [subprocess.Popen(argv, env=env) for _ in range(cfg.workers)]

    def forward(signum: int, frame: Any) -> None:
        for child in children:
            if child.poll() is None:
                child.send_signal(signum)

    signal.signal(signal.SIGTERM, forward)
    signal.signal(signal.SIGINT, forward)
    status = 0
    for child in children:
        status = max(status, child.wait())
    return status
