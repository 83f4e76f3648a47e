"""Process entry: build arena, engine, app and server; run the loop; supervise workers."""

from __future__ import annotations

import asyncio
import logging
import os
import shutil
import signal
import sys
import tempfile
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..app import App
from ..app.backends.images import ImageFetchPolicy
from ..app.limits import ApiLimits
from ..edge import Edge
from ..edge.tracing import configure_otlp
from ..models.catalog import server_catalog
from ..models.pull import pull
from ..runtime import Arena, Engine, ModelConfig, RuntimeOptions
from ..runtime.model_manager import DEFAULT_KEEP_ALIVE_S, ModelManager
from ..runtime.priority import raise_loop
from . import memory
from .metrics_peers import MetricsPeers
from .server import Server, bind_socket
from .supervisor import WorkerSupervisor

if TYPE_CHECKING:
    from ..app.batch import BatchOptions
    from ..edge import EdgeOptions
    from ..models.loader import ModelRef
    from .options import ServerOptions

log = logging.getLogger("zeroserve")

_CHILD_ENV = "ZEROSERVE_INTERNAL_CHILD"
# The directory where the HTTP processes of one --workers N server meet for /metrics.
_METRICS_DIR_ENV = "ZEROSERVE_INTERNAL_METRICS_DIR"
# The port a supervisor chose for its children when it was given --port 0.
_PORT_ENV = "ZEROSERVE_INTERNAL_PORT"


@dataclass(frozen=True, slots=True)
class CatalogOptions:
    """Models at run time (docs/architecture.md, "Models at run time"): the models
    directory, the pull cache whose models join the catalog (None: not served;
    docs/models.md, "Pulled models in the catalog"), how long an idle model stays
    loaded, the cap on loaded models, and whether a request loads the model it names."""

    models_dir: Path | None = None
    cache: Path | None = None
    keep_alive_s: float = DEFAULT_KEEP_ALIVE_S
    models_max: int | None = None
    models_memory: int | None = None
    autoload: bool = False
    allow_pull: bool = False


def engine_configs(specs: list[ModelRef]) -> dict[str, ModelConfig]:
    out: dict[str, ModelConfig] = {}
    for spec in specs:
        out[spec.name] = ModelConfig(
            name=spec.name, factory=spec.load_class(), options=spec.options, **spec.runtime
        )
    return out


async def serve_async(
    options: ServerOptions,
    specs: list[ModelRef],
    *,
    arena_bytes: int,
    ready: Any = None,
    runtime: RuntimeOptions | None = None,
    edge: EdgeOptions | None = None,
    ui: bool = True,
    api_limits: ApiLimits | None = None,
    catalog: CatalogOptions | None = None,
    batch: BatchOptions | None = None,
    image_fetch: ImageFetchPolicy | None = None,
) -> None:
    catalog = catalog or CatalogOptions()
    models_dir, cache = catalog.models_dir, catalog.cache
    entries = server_catalog(specs, models_dir, cache)  # SpecError before anything starts
    arena = Arena(arena_bytes)
    engine = Engine(engine_configs(specs), arena=arena, options=runtime)
    manager: ModelManager | None = None
    app: App | None = None
    peers_dir = os.environ.get(_METRICS_DIR_ENV)
    peers = MetricsPeers(peers_dir) if peers_dir else None
    try:
        await engine.start()
        if edge is not None and edge.tracing:
            configure_otlp()
        manager = ModelManager(
            engine,
            entries,
            loaded=engine.names(),
            keep_alive_s=catalog.keep_alive_s,
            models_max=catalog.models_max,
            models_memory=catalog.models_memory,
            source=(lambda: server_catalog(specs, models_dir, cache))
            if models_dir or cache
            else None,
            pull=pull if catalog.allow_pull else None,
        )
        app = App(
            engine,
            Edge(edge),
            metrics_view=peers.scrape if peers is not None else None,
            ui=ui,
            limits=api_limits,
            models=manager,
            autoload=catalog.autoload,
            batch=batch,
            image_fetch=image_fetch,
        )
        app.start()
        server = Server(app, arena, options)
        await server.start()
        if peers is not None:
            # After the listener is up: the supervisor reads this socket as "it serves".
            await peers.start()
        server.install_signal_handlers()
        manager.start()
        if manager.can_refresh():
            _rescan_on_sighup(manager)
        memory.settle()
        names = ", ".join(engine.names())
        scheme = "https" if options.tls is not None else "http"
        # One write per line: --workers children share this stdout, and print() writes
        # the text and its newline separately when unbuffered (lines would interleave).
        sys.stdout.write(
            f"zeroserve {os.getpid()} serving [{names}] on {scheme}://{options.host}:{server.port}\n"
        )
        sys.stdout.flush()
        if ready is not None:
            ready(server)
        await server.wait_stopped()
    finally:
        memory.unsettle()
        if manager is not None:
            await manager.aclose()
        if peers is not None:
            await peers.aclose()
        if app is not None:
            await app.aclose()  # the gateway's pooled upstream connections
        await engine.aclose()
        arena.close()


def _rescan_on_sighup(manager: ModelManager) -> None:
    """SIGHUP rescans the models directory and the cache (as ``POST /v2/repository/index``
    does)."""
    loop = asyncio.get_running_loop()
    tasks: set[asyncio.Task[None]] = set()

    async def rescan() -> None:
        try:
            added, removed = await manager.refresh()
        except Exception as exc:  # a broken model.toml: the catalog stays as it was
            log.error("rescan of the catalog failed: %s", exc)
            return
        log.info("catalog rescanned: added %s, removed %s", added, removed)

    def on_hup() -> None:
        task = asyncio.ensure_future(rescan())
        tasks.add(task)
        task.add_done_callback(tasks.discard)

    loop.add_signal_handler(signal.SIGHUP, on_hup)


def run_loop(loop: str, coro: Any) -> None:
    """Run ``coro`` on uvloop (``auto``: when installed) or on asyncio's own loop."""
    use_uvloop = loop in ("auto", "uvloop")
    if use_uvloop:
        try:
            import uvloop
        except ImportError:
            if loop == "uvloop":
                raise
            use_uvloop = False
    if use_uvloop:
        uvloop.run(coro)
    else:
        asyncio.run(coro)


def serve(
    options: ServerOptions,
    specs: list[ModelRef],
    *,
    arena_bytes: int,
    loop: str = "auto",
    loop_rt_priority: int = 0,
    workers: int = 1,
    runtime: RuntimeOptions | None = None,
    edge: EdgeOptions | None = None,
    ui: bool = True,
    api_limits: ApiLimits | None = None,
    catalog: CatalogOptions | None = None,
    batch: BatchOptions | None = None,
    image_fetch: ImageFetchPolicy | None = None,
) -> int:
    if workers > 1 and not os.environ.get(_CHILD_ENV):
        return _supervise(workers, options)
    if port := os.environ.get(_PORT_ENV):  # the supervisor's choice for --port 0
        options = replace(options, port=int(port))
    raise_loop(loop_rt_priority)  # this thread runs the loop; each --workers child raises its own
    run_loop(
        loop,
        serve_async(
            options,
            specs,
            arena_bytes=arena_bytes,
            runtime=runtime,
            edge=edge,
            ui=ui,
            api_limits=api_limits,
            catalog=catalog,
            batch=batch,
            image_fetch=image_fetch,
        ),
    )
    return 0


def _supervise(workers: int, options: ServerOptions) -> int:
    """Run ``workers`` HTTP processes sharing the port through SO_REUSEPORT, each replaced
    when it dies (``supervisor.py``). Each child is this same command line.

    ``--port 0`` is resolved here, once: a socket of the reuse-port group is bound (never
    listening, so it takes no connection) and held while the children run, so every child
    binds the same port and it stays this server's when one of them dies."""
    peers_dir = tempfile.mkdtemp(prefix="zeroserve-metrics-")
    env = dict(os.environ, **{_CHILD_ENV: "1", _METRICS_DIR_ENV: peers_dir})
    reserved = None
    if options.port == 0:
        reserved = bind_socket(options.host, 0, reuse_port=True)
        env[_PORT_ENV] = str(reserved.getsockname()[1])
    argv = [sys.executable, "-m", "zeroserve", *sys.argv[1:]]
    try:
        return WorkerSupervisor(argv, env, workers, Path(peers_dir)).run()
    finally:
        shutil.rmtree(peers_dir, ignore_errors=True)
        if reserved is not None:
            reserved.close()
