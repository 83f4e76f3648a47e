"""The ``process`` executor: N spawned workers per model, payloads in shared memory.

This module is the process side of the executor: spawning workers, slots, and recovering
from crashes and hangs. Everything about one call on a worker (descriptors, leases,
credits, the frames) is the worker's :class:`~..worker.link.WorkerLink`, which the
``ray`` executor's same-node actors use too.

Strategy
--------
Each worker is a ``multiprocessing`` *spawn* process (no inherited locks or threads)
given one end of a socketpair; the arena's memfd is sent over it with ``SCM_RIGHTS`` and
mapped there (:mod:`.worker`). Control frames are msgspec msgpack (:mod:`..worker.wire`);
inputs and outputs stay in the arena (see :mod:`..worker.link`), copies counted at the
``process_input`` and ``process_output`` sites.

* Faults: EOF on a worker's socket means it died. Its calls fail with ``WorkerError``,
  their leases are released, the process is reaped, ``ready()`` is false, and a new
  worker is spawned (back-off doubling from ``restart_backoff_s``).
* Hung work: every call carries its deadline (loop time). A call past its deadline keeps
  its worker out of scheduling (``acquire`` skips it); a call still running
  ``hang_grace_s`` past it, or past the moment its requests abandoned it (a client's
  disconnect), means the worker is hung: it is killed, which takes the crash path above
  (the other calls on it get 503), and counted in ``reclaimed``
  (docs/decisions/0025-abandoned-work-grace-starts-at-abandonment.md).
* Capacity: a worker being respawned, or killed for hanging, takes no work. With no
  worker left to take it, ``has_capacity()`` is false and admission answers 503 at the
  head (``unavailable``: "restarting", or the hung answer) instead of queueing requests
  into a model that cannot serve them.

Invariants
----------
* A worker runs at most one batch at a time from the batchers (a slot), but any number of
  streams.
* Everything here runs on the event-loop thread; blocking calls (``join``) go to threads.
"""

from __future__ import annotations

import asyncio
import logging
import multiprocessing
import socket
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from ... import errors
from ...errors import ModelLoadError, WorkerError
from ...models.base import GenerateRequest
from .. import contract
from ..arena import Arena
from ..channel import Channel
from ..classes import Priority
from ..contract import Executor, Producer
from ..results import InferResult, WorkerStatistics
from ..waiters import Waiters
from ..worker import wire as p
from ..worker.link import Call, CopySites, LinkStream, WorkerLink, loop_now
from .worker import worker_main

if TYPE_CHECKING:
    from multiprocessing.process import BaseProcess

    import numpy as np

    from ..options import ResolvedModel, RuntimeOptions

log = logging.getLogger("zeroserve.runtime")

SITES = CopySites(input="process_input", output="process_output")


class WorkerProcess(WorkerLink):
    """The server's side of one spawned worker: its link, and its process."""

    __slots__ = ("proc",)

    def __init__(
        self,
        owner: ProcessExecutor,
        index: int,
        proc: BaseProcess,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        pid: int,
        sock: socket.socket,
    ) -> None:
        super().__init__(owner, owner.arena, index, reader, writer, sock, pid, SITES)
        self.proc = proc


async def _close_socket(writer: asyncio.StreamWriter, sock: socket.socket) -> None:
    """Close a socket whose worker never became a link (it failed to load)."""
    writer.close()
    try:
        await writer.wait_closed()
    except (ConnectionError, OSError):
        pass
    sock.close()


class _RemoteProducer(Producer):
    def __init__(
        self,
        ex: ProcessExecutor,
        req: GenerateRequest,
        channel: Channel,
        deadline_at: float | None,
        on_start: Callable[[], None] | None = None,
    ) -> None:
        self.stream: LinkStream | None = None
        self.task = asyncio.get_running_loop().create_task(
            self._start(ex, req, channel, deadline_at, on_start)
        )

    async def _start(
        self,
        ex: ProcessExecutor,
        req: GenerateRequest,
        channel: Channel,
        deadline_at: float | None,
        on_start: Callable[[], None] | None,
    ) -> None:
        try:
            worker = await ex._wait_worker()
            if on_start is not None:  # a worker takes it: the queue wait is over
                on_start()
            self.stream = worker.start_stream(req, channel, deadline_at)
        except asyncio.CancelledError:
            raise
        except BaseException as exc:  # delivered through the channel, not the task
            channel.close(exc)

    def abort(self) -> None:
        if not self.task.done():
            self.task.cancel()
        elif self.stream is not None:
            self.stream.abort()


class ProcessExecutor(Executor):
    kind = "process"

    def __init__(self, spec: ResolvedModel, arena: Arena, options: RuntimeOptions) -> None:
        super().__init__(spec, arena)
        self.options = options
        self.ctx = multiprocessing.get_context("spawn")
        self.workers: list[WorkerProcess | None] = [None] * spec.workers
        self._waiters = Waiters(options.priority_aging_s)
        self._tasks: set[asyncio.Task[None]] = set()
        self._closing = False
        self._started = False
        self.restarts = 0
        self.crashes = 0
        self.reclaimed = 0

    # -- lifecycle -----------------------------------------------------------------------
    async def start(self, timeout: float) -> None:
        results = await asyncio.gather(
            *(self._spawn(i, timeout) for i in range(self.spec.workers)), return_exceptions=True
        )
        for res in results:
            if isinstance(res, BaseException):
                await self.aclose()
                if isinstance(res, ModelLoadError):
                    raise res
                raise ModelLoadError(self.spec.name, f"{type(res).__name__}: {res}") from res
        self._started = True

    async def _spawn(self, index: int, timeout: float) -> None:
        spec = self.spec
        parent, child = socket.socketpair()
        proc = self.ctx.Process(
            target=worker_main,
            args=(child, spec.factory, dict(spec.options), spec.name, self.arena.size, spec.nice),
            name=f"zeroserve-{spec.name}-{index}",
            daemon=True,
        )
        try:
            proc.start()
        except BaseException:
            parent.close()
            child.close()
            raise
        child.close()
        try:
            socket.send_fds(parent, [b"A"], [self.arena.fd])
            parent.setblocking(False)
            reader, writer = await asyncio.open_unix_connection(sock=parent)
        except BaseException:
            parent.close()
            await self._reap(proc)
            raise
        try:
            msg = p.TO_SERVER.decode(await asyncio.wait_for(p.read_frame(reader), timeout))
        except TimeoutError:
            cause = f"load() did not finish in {timeout} s"
            msg = None
        except (asyncio.IncompleteReadError, ConnectionError):
            msg = None
            cause = "the worker process exited while loading"
        except BaseException:
            await _close_socket(writer, parent)
            await self._reap(proc)
            raise
        if not isinstance(msg, p.Ready):
            await _close_socket(writer, parent)
            code = await self._reap(proc)
            if isinstance(msg, p.LoadFailed):
                cause = msg.error
            elif msg is not None:
                cause = f"unexpected first frame {type(msg).__name__}"
            else:
                cause = f"{cause} (exit code {code})"
            raise ModelLoadError(spec.name, cause)
        worker = WorkerProcess(self, index, proc, reader, writer, msg.pid, parent)
        worker.task = asyncio.get_running_loop().create_task(self._read(worker))
        self.workers[index] = worker
        self._notify()

    async def _reap(self, proc: BaseProcess) -> int | None:
        """Wait for a worker to exit (killing it past the shutdown timeout); no zombie,
        no leaked sentinel fd."""
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(None, proc.join, self.options.shutdown_timeout_s)
        if proc.exitcode is None:
            proc.kill()
            await loop.run_in_executor(None, proc.join, self.options.shutdown_timeout_s)
        code = proc.exitcode
        try:
            proc.close()
        except ValueError:
            pass
        return code

    def local_pids(self) -> list[int]:
        return [w.pid for w in self.workers if w is not None]

    def ready(self) -> bool:
        return (
            self._started
            and not self._closing
            and all(w is not None and w.ready for w in self.workers)
            and self.has_capacity()
        )

    async def aclose(self) -> None:
        self._closing = True
        for t in list(self._tasks):
            t.cancel()
        workers = [w for w in self.workers if w is not None]
        for w in workers:
            w.send(p.Shutdown())
        for w in workers:
            await self._reap(w.proc)
            if w.task is not None:
                try:
                    await w.task
                except BaseException:
                    pass
            await w.aclose()
            w.fail_calls(errors.Closed("the engine is shutting down"))
        self.workers = [None] * len(self.workers)
        self._notify()

    # -- a worker's life ---------------------------------------------------------------------
    async def _read(self, w: WorkerProcess) -> None:
        failure = await w.read()
        if failure is not None:  # a protocol error: the worker is not trustworthy
            w.proc.kill()
            w.fail_calls(WorkerError(f"worker protocol error: {failure!r}"))
        if self._closing:
            return
        w.ready = False
        if not w.hung:
            self.crashes += 1
        task = asyncio.get_running_loop().create_task(self._recover(w))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _recover(self, w: WorkerProcess) -> None:
        code = await self._reap(w.proc)
        await w.aclose()
        w.fail_calls(
            WorkerError(
                f"worker process {w.pid} of model {self.spec.name!r} died "
                f"(exit code {code}) while serving this request",
                status=503,
            ),
        )
        if self.workers[w.index] is w:
            self.workers[w.index] = None
        self._notify()  # requests waiting for this worker re-check capacity
        delay = self.options.restart_backoff_s
        while not self._closing:
            try:
                await self._spawn(w.index, self.options.load_timeout_s)
                self.restarts += 1
                return
            except ModelLoadError:
                await asyncio.sleep(delay)
                delay = min(delay * 2, self.options.max_restart_backoff_s)

    # -- LinkOwner -----------------------------------------------------------------------------
    def call_ended(self, link: WorkerLink, call: Call) -> None:
        if call.kind != "stream" and link.busy and not link.batch_running():
            link.busy = False
        self._notify()

    def hung(self, link: WorkerLink, call: Call) -> None:
        w = self.workers[link.index]
        if w is not link or w is None or self._closing:
            return
        w.hung = True
        self.reclaimed += 1
        log.warning(
            "model %r: worker %d (pid %d) ran a %s call %.1f s past its deadline or its "
            "abandonment; killing and restarting it",
            self.spec.name,
            w.index,
            w.pid,
            call.kind,
            self.options.hang_grace_s,
        )
        w.proc.kill()  # EOF follows: the crash path fails its calls (503) and respawns it

    def has_capacity(self) -> bool:
        now = loop_now()
        return any(w is not None and w.usable(now) for w in self.workers)

    def unavailable(self) -> errors.ZeroserveError | None:
        """While no worker can take work because some are being restarted (crashed, or
        killed for hung work): "N of M workers restarting" (503, ``Retry-After``). When
        every worker is running work past its deadline instead, None (the hung answer)."""
        restarting = sum(1 for w in self.workers if w is None or w.hung or not w.ready)
        if restarting == 0 or self.has_capacity():
            return None
        return contract.restarting(
            f"model {self.spec.name!r} has no worker to take this request: {restarting} of "
            f"{len(self.workers)} workers restarting; retry later"
        )

    # -- slots -----------------------------------------------------------------------------
    def _notify(self) -> None:
        self._waiters.wake_all()

    async def _wait(self) -> None:
        await self._waiters.wait()

    async def acquire(self, priority: Priority, arrived: float) -> WorkerProcess:
        return await self._waiters.take(self._free_worker, priority, arrived)

    def _free_worker(self) -> WorkerProcess | None:
        """A usable idle worker, now marked busy (None: none)."""
        if self._closing:
            raise errors.Closed("the engine is shutting down")
        now = asyncio.get_running_loop().time()
        for w in self.workers:
            if w is not None and w.usable(now) and not w.busy:
                w.busy = True
                return w
        return None

    def release(self, slot: Any) -> None:
        # A batch abandoned by its requests (deadline, disconnect) may still be running in
        # the worker: the slot is free only when it ended (call_ended).
        w: WorkerProcess = slot
        if not w.batch_running():
            w.busy = False
            self._notify()

    async def _wait_worker(self) -> WorkerProcess:
        """The ready worker with the fewest streams (waiting out a restart)."""
        while True:
            if self._closing:
                raise errors.Closed("the engine is shutting down")
            now = asyncio.get_running_loop().time()
            ready = [w for w in self.workers if w is not None and w.usable(now)]
            if ready:
                return min(ready, key=lambda w: w.streams)
            await self._wait()

    # -- work ------------------------------------------------------------------------------
    async def infer(
        self, slot: Any, batch: list[Mapping[str, Any]], *, deadline_at: float | None = None
    ) -> list[InferResult | BaseException]:
        w: WorkerProcess = slot
        return await w.infer(batch, deadline_at)

    async def embed(
        self, slot: Any, texts: list[str], *, deadline_at: float | None = None
    ) -> np.ndarray:
        w: WorkerProcess = slot
        return await w.embed(texts, deadline_at)

    def generate(
        self,
        req: GenerateRequest,
        channel: Channel,
        *,
        deadline_at: float | None = None,
        on_start: Callable[[], None] | None = None,
    ) -> Producer:
        return _RemoteProducer(self, req, channel, deadline_at, on_start)

    def statistics(self) -> WorkerStatistics:
        live = [w for w in self.workers if w is not None]
        now = loop_now()
        return WorkerStatistics(
            executor=self.kind,
            workers=len(self.workers),
            ready=sum(1 for w in live if w.usable(now)),
            busy=sum(1 for w in live if w.busy),
            streams=sum(w.streams for w in live),
            restarts=self.restarts,
            crashes=self.crashes,
            reclaimed=self.reclaimed,
        )
