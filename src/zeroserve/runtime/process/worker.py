"""The process worker: the child side of the ``process`` executor, a spawned process
that serves one model over its end of a socketpair.

Strategy
--------
A worker is spawned with one end of a socketpair; the arena's memfd arrives over it
(``SCM_RIGHTS``) and is mapped with :func:`~..arena.attach`, so request bodies are read
and outputs written in place. The worker loads its model once, answers ``Ready`` (or
``LoadFailed``), then serves the worker protocol with the shared
:class:`~..worker.loop.WorkerLoop` on an asyncio event loop (uvloop when installed).

Invariant: when the server goes away (EOF on the socket), the worker exits, even with
threads still stuck in model code.
"""

from __future__ import annotations

import asyncio
import os
import signal
import socket
from collections.abc import Callable, Mapping
from typing import Any

from ...models.base import Model
from ..arena import attach
from ..model_calls import make_model, maybe_await
from ..priority import lower_process
from ..worker import wire as p
from ..worker.loop import WORKER_THREADS, WorkerLoop

# WORKER_THREADS: the pool of the loop a process worker runs, named here too because it
# is this process's thread budget (tests size their hung steps by it).
__all__ = ["WORKER_THREADS", "worker_main"]


def worker_main(
    sock: socket.socket,
    factory: Callable[..., Model],
    options: Mapping[str, Any],
    name: str,
    arena_size: int,
    nice: int = 0,
) -> None:
    """Entry point of a spawned worker process; all of it is model work, so it runs
    ``nice`` levels below the server's event loop (runtime/priority.py)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the server decides when we stop
    lower_process(nice)
    sock.setblocking(True)
    _, fds, _, _ = socket.recv_fds(sock, 1, 1)
    view = attach(fds[0], arena_size)
    os.close(fds[0])
    sock.setblocking(False)
    try:
        import uvloop

        runner = asyncio.Runner(loop_factory=uvloop.new_event_loop)
    except ImportError:  # pragma: no cover - uvloop is a dependency on Linux
        runner = asyncio.Runner()
    with runner:
        runner.run(_serve(sock, view, factory, options, name))
    # Threads stuck in model code must not keep a finished worker alive.
    os._exit(0)


async def _serve(
    sock: socket.socket,
    view: memoryview,
    factory: Callable[..., Model],
    options: Mapping[str, Any],
    name: str,
) -> None:
    reader, writer = await asyncio.open_unix_connection(sock=sock)
    try:
        model = make_model(factory, options)
        load: Callable[[], Any] = model.load  # sync, or async def
        loaded = load()
        await maybe_await(loaded)
    except BaseException as exc:
        writer.write(p.frame(p.LoadFailed(f"{type(exc).__name__}: {exc}")))
        await writer.drain()
        return
    worker = WorkerLoop(model, view, writer, name)
    writer.write(p.frame(p.Ready(os.getpid())))
    await worker.run(reader)
