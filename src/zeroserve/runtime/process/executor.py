"""The ``process`` executor: N spawned workers per model, payloads in shared memory.

This module holds one concept, the server side of the process executor (spawning,
dispatching frames, recovering from crashes); it is over 400 lines because those three
share every call's state (:class:`_Call`) and are clearer read together.

Strategy
--------
Each worker is a ``multiprocessing`` *spawn* process (no inherited locks or threads)
given one end of a socketpair; the arena's memfd is sent over it with ``SCM_RIGHTS`` and
mapped there (:mod:`.worker`). Control frames are msgspec msgpack (:mod:`.wire`).

* Inputs: an ndarray that is a view into the arena (the request body) travels as a
  descriptor, and the lease holding it is retained for the request's life; anything else
  is copied once into a new lease, counted at ``copied_bytes{site="process_input"}``.
* Outputs: the worker describes arrays already in the arena by offset, and writes other
  outputs into leases it asks this side to allocate (``Alloc``). Every lease a request
  touches is recorded on its :class:`_Call`; the leases backing its outputs are retained
  into ``InferResult.leases`` and the call's own references are dropped when the worker
  sends the request's terminal frame, or when the worker dies.
* Streams: per-stream credits (``Generate.window`` = channel capacity); the consumer
  taking pieces returns credits (``block``), or credits return on receipt (``coalesce``,
  which never stalls the producer but is capped in bytes).
* Faults: EOF on a worker's socket means it died. Its calls fail with ``WorkerError``,
  their leases are released, the process is reaped, ``ready()`` is false, and a new
  worker is spawned (back-off doubling from ``restart_backoff_s``).
* Hung work: every call carries its deadline (loop time). A call past its deadline keeps
  its worker out of scheduling (``acquire`` skips it; with none left, ``has_capacity()``
  is false and admission answers 503); a call still running ``hang_grace_s`` past it
  means the worker is hung: it is killed, which takes the crash path above (the other
  calls on it get 503), and counted in ``reclaimed``.

Invariants
----------
* A worker runs at most one batch at a time from the batchers (a slot), but any number of
  streams.
* Everything here runs on the event-loop thread; blocking calls (``join``) go to threads.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import multiprocessing
import socket
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

import msgspec
import numpy as np

from ... import errors, metrics
from ...errors import ModelLoadError, Overloaded, WorkerError, WouldBlock
from ...models.base import GenerateRequest
from .._common import (
    Executor,
    InferResult,
    Producer,
    Waiters,
    WorkerStatistics,
)
from ..arena import Arena, Lease
from ..channel import Channel
from ..inproc import validate_inputs
from ..tensors import (
    BYTES,
    TensorDesc,
    arena_offset,
    as_array,
    bytes_tensor_size,
    from_desc,
    write_bytes_tensor,
)
from . import wire as p
from .worker import worker_main

if TYPE_CHECKING:
    from multiprocessing.process import BaseProcess

    from ..options import ResolvedModel, RuntimeOptions

log = logging.getLogger("zeroserve.runtime")


def _rebuild_error(name: str, message: str, status: int) -> errors.ZeroserveError:
    cls = errors.error_class(name)
    if cls is not None:
        try:
            return cls(message, status=status)  # type: ignore[call-arg]
        except TypeError:
            pass
    return WorkerError(message, status=status if status >= 500 else 500)


def _loop_now() -> float | None:
    """Event-loop time, the clock of calls' ``deadline_at``; None off the loop (nothing
    counts as overdue there)."""
    try:
        return asyncio.get_running_loop().time()
    except RuntimeError:
        return None


async def _close_writer(writer: asyncio.StreamWriter, sock: socket.socket) -> None:
    """Close a worker's socket now (not on a later loop turn), so no fd outlives it.
    uvloop transports work on a duplicate of the socket, so the original is closed too."""
    writer.close()
    try:
        await writer.wait_closed()
    except (ConnectionError, OSError):
        pass
    sock.close()


class _Call:
    """One request (or batch, or stream) in flight on a worker."""

    __slots__ = (
        "abandoned",
        "channel",
        "credit",
        "deadline_at",
        "future",
        "hang_timer",
        "id",
        "kind",
        "leases",
        "window",
    )

    def __init__(self, rid: int, kind: str, deadline_at: float | None = None) -> None:
        self.id = rid
        self.kind = kind
        self.leases: list[Lease] = []
        self.future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self.channel: Channel | None = None
        self.abandoned = False
        self.credit = 0
        self.window = 0
        self.deadline_at = deadline_at
        self.hang_timer: asyncio.TimerHandle | None = None

    def overdue(self, now: float | None) -> bool:
        return self.deadline_at is not None and now is not None and now >= self.deadline_at

    def release(self) -> None:
        """The call ended (its terminal frame came, or its worker died)."""
        if self.hang_timer is not None:
            self.hang_timer.cancel()
            self.hang_timer = None
        leases, self.leases = self.leases, []
        for lease in leases:
            lease.release()


class WorkerProcess:
    """The server's side of one spawned worker: its process, socket and calls."""

    __slots__ = (
        "busy",
        "calls",
        "hung",
        "index",
        "pid",
        "proc",
        "reader",
        "ready",
        "sock",
        "task",
        "writer",
    )

    def __init__(
        self,
        index: int,
        proc: BaseProcess,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        pid: int,
        sock: socket.socket,
    ) -> None:
        self.sock = sock
        self.index = index
        self.proc = proc
        self.reader = reader
        self.writer = writer
        self.pid = pid
        self.calls: dict[int, _Call] = {}
        self.ready = True
        self.busy = False
        self.hung = False  # killed for a hung call; its EOF is not counted as a crash
        self.task: asyncio.Task[None] | None = None

    def send(self, msg: Any) -> None:
        if not self.writer.is_closing():
            self.writer.write(p.frame(msg))

    @property
    def streams(self) -> int:
        return sum(1 for c in self.calls.values() if c.kind == "stream")

    def batch_running(self) -> bool:
        """A batch (infer/embed) is still running here, abandoned or not: the worker's
        slot stays taken until it ends."""
        return any(c.kind != "stream" for c in self.calls.values())

    def usable(self, now: float | None) -> bool:
        """Ready, and not running a call past its deadline (a worker that may be hung
        gets no new work)."""
        return self.ready and not self.hung and not any(c.overdue(now) for c in self.calls.values())


class _RemoteProducer(Producer):
    def __init__(
        self,
        ex: ProcessExecutor,
        req: GenerateRequest,
        channel: Channel,
        deadline_at: float | None,
        on_start: Callable[[], None] | None = None,
    ) -> None:
        self.ex = ex
        self.channel = channel
        self.deadline_at = deadline_at
        self.worker: WorkerProcess | None = None
        self.call: _Call | None = None
        self.task = asyncio.get_running_loop().create_task(self._start(req, on_start))

    async def _start(self, req: GenerateRequest, on_start: Callable[[], None] | None) -> None:
        ex, channel = self.ex, self.channel
        try:
            worker = await ex._wait_worker()
            if on_start is not None:  # a worker takes it: the queue wait is over
                on_start()
            call = _Call(next(ex._ids), "stream", self.deadline_at)
            call.channel = channel
            call.window = channel.capacity
            raw: TensorDesc | None = None
            if req.raw is not None:
                raw = ex._describe(as_array(req.raw, name="raw"), call)
                req = msgspec.structs.replace(req, raw=None)
        except asyncio.CancelledError:
            raise
        except BaseException as exc:  # delivered through the channel, not the task
            channel.close(exc)
            return
        self.worker, self.call = worker, call
        ex._register(worker, call)
        if channel.policy == "block":
            channel.on_take = lambda n: ex._return_credit(worker, call, n)
        worker.send(p.Generate(call.id, msgspec.msgpack.encode(req), raw, call.window))

    def abort(self) -> None:
        if not self.task.done():
            self.task.cancel()
            return
        call, worker = self.call, self.worker
        if call is not None and worker is not None and not call.abandoned:
            call.abandoned = True
            if call.id in worker.calls:
                worker.send(p.Abort(call.id))


class ProcessExecutor(Executor):
    kind = "process"

    def __init__(self, spec: ResolvedModel, arena: Arena, options: RuntimeOptions) -> None:
        super().__init__(spec, arena)
        self.options = options
        self.ctx = multiprocessing.get_context("spawn")
        self.workers: list[WorkerProcess | None] = [None] * spec.workers
        self._ids = itertools.count(1)
        self._waiters = Waiters()
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
            await _close_writer(writer, parent)
            await self._reap(proc)
            raise
        if not isinstance(msg, p.Ready):
            await _close_writer(writer, parent)
            code = await self._reap(proc)
            if isinstance(msg, p.LoadFailed):
                cause = msg.error
            elif msg is not None:
                cause = f"unexpected first frame {type(msg).__name__}"
            else:
                cause = f"{cause} (exit code {code})"
            raise ModelLoadError(spec.name, cause)
        worker = WorkerProcess(index, proc, reader, writer, msg.pid, parent)
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
            await _close_writer(w.writer, w.sock)
            self._fail_calls(w, errors.Closed("the engine is shutting down"))
        self.workers = [None] * len(self.workers)
        self._notify()

    # -- reading a worker ----------------------------------------------------------------
    async def _read(self, w: WorkerProcess) -> None:
        try:
            while True:
                msg = p.TO_SERVER.decode(await p.read_frame(w.reader))
                self._dispatch(w, msg)
        except (asyncio.IncompleteReadError, ConnectionError, OSError):
            pass
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # a protocol error: the worker is not trustworthy
            w.proc.kill()
            self._fail_calls(w, WorkerError(f"worker protocol error: {exc!r}"))
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
        await _close_writer(w.writer, w.sock)
        self._fail_calls(
            w,
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

    def _fail_calls(self, w: WorkerProcess, exc: errors.ZeroserveError) -> None:
        calls = list(w.calls.values())
        w.calls.clear()
        for call in calls:
            call.release()
            if call.channel is not None:
                call.channel.abort(exc) if not call.channel.closed else None
            elif not call.future.done():
                call.future.set_exception(exc)

    def _dispatch(self, w: WorkerProcess, msg: Any) -> None:
        if isinstance(msg, p.Pieces):
            call = w.calls.get(msg.id)
            if call is None or call.abandoned or call.channel is None:
                return
            channel = call.channel
            view = self.arena.view
            for item in msg.items:
                piece: Any
                if isinstance(item, str):
                    piece = item
                elif isinstance(item, p.Blob):
                    piece = item.data
                else:
                    piece = view[item.offset : item.offset + item.length]
                try:
                    channel.send_nowait(piece)
                except WouldBlock:
                    self._abandon(w, call)
                    channel.abort(WorkerError("worker sent a piece beyond its credit"))
                    return
                except errors.ZeroserveError:
                    self._abandon(w, call)  # consumer gone, or coalesce cap passed
                    return
            if channel.policy == "coalesce":
                self._return_credit(w, call, len(msg.items))
            return
        if isinstance(msg, p.Alloc):
            self._allocate(w, msg)
            return
        if not isinstance(msg, p.InferDone | p.EmbedDone | p.End | p.Fail):
            return  # no other frame belongs to a call
        call = w.calls.pop(msg.id, None)
        if call is None:
            return
        try:
            if isinstance(msg, p.InferDone):
                self._infer_done(call, msg)
            elif isinstance(msg, p.EmbedDone):
                metrics.count_copy("process_output", len(msg.data))
                vecs = np.frombuffer(msg.data, dtype=np.float32).reshape(msg.shape)
                if not call.future.done():
                    call.future.set_result(vecs)
            elif isinstance(msg, p.End):
                if call.channel is not None:
                    call.channel.close(result=msg.result)
            elif isinstance(msg, p.Fail):
                exc = _rebuild_error(msg.error, msg.message, msg.status)
                if call.channel is not None:
                    if not call.abandoned:
                        call.channel.close(exc)
                elif not call.future.done():
                    call.future.set_exception(exc)
        finally:
            call.release()
            self._call_ended(w, call)

    def _abandon(self, w: WorkerProcess, call: _Call) -> None:
        if not call.abandoned:
            call.abandoned = True
            w.send(p.Abort(call.id))

    def _return_credit(self, w: WorkerProcess, call: _Call, n: int) -> None:
        if call.abandoned or call.id not in w.calls:
            return
        call.credit += n
        if call.credit >= max(1, call.window // 2):
            w.send(p.Credit(call.id, call.credit))
            call.credit = 0

    def _allocate(self, w: WorkerProcess, msg: p.Alloc) -> None:
        call = w.calls.get(msg.id)
        if call is None:
            w.send(p.Allocated(msg.id, [], "unknown request"))
            return
        leases: list[Lease] = []
        try:
            for n in msg.sizes:
                leases.append(self.arena.allocate(n))
        except Overloaded as exc:
            for lease in leases:
                lease.release()
            w.send(p.Allocated(msg.id, [], exc.message))
            return
        call.leases.extend(leases)
        w.send(p.Allocated(msg.id, [lease.offset for lease in leases]))

    def _infer_done(self, call: _Call, msg: p.InferDone) -> None:
        if msg.copied:
            metrics.count_copy("process_output", msg.copied)
        if call.future.done():
            return
        results: list[InferResult] = []
        try:
            for described in msg.outputs:
                outputs: dict[str, Any] = {}
                held: list[Lease] = []
                for key, desc in described.items():
                    lease = self._owner(call, desc)
                    arr = from_desc(self.arena.view, desc)
                    if desc.dtype == BYTES:
                        metrics.count_copy("process_output", desc.length)
                    outputs[key] = arr
                    if all(lease is not h for h in held):
                        held.append(lease.retain())
                results.append(InferResult(outputs, held))
        except Exception as exc:
            for r in results:
                r.release()
            call.future.set_exception(WorkerError(f"bad output from worker: {exc}"))
            return
        call.future.set_result(results)

    @staticmethod
    def _owner(call: _Call, desc: TensorDesc) -> Lease:
        for lease in call.leases:
            if (
                lease.offset <= desc.offset
                and desc.offset + desc.length <= lease.offset + lease.block
            ):
                return lease
        raise WorkerError("worker described memory outside the request's leases")

    # -- hung work ---------------------------------------------------------------------------
    def _register(self, w: WorkerProcess, call: _Call) -> None:
        """Put ``call`` in flight on ``w``, watched for hanging past its deadline."""
        w.calls[call.id] = call
        if call.deadline_at is not None:
            loop = asyncio.get_running_loop()
            when = call.deadline_at + self.options.hang_grace_s
            call.hang_timer = loop.call_at(when, self._hung, w, call)

    def _hung(self, w: WorkerProcess, call: _Call) -> None:
        if call.id not in w.calls or w.hung or self._closing or self.workers[w.index] is not w:
            return
        w.hung = True
        self.reclaimed += 1
        log.warning(
            "model %r: worker %d (pid %d) ran a %s call %.1f s past its deadline; killing "
            "and restarting it",
            self.spec.name,
            w.index,
            w.pid,
            call.kind,
            self.options.hang_grace_s,
        )
        w.proc.kill()  # EOF follows: the crash path fails its calls (503) and respawns it

    def has_capacity(self) -> bool:
        now = _loop_now()
        return any(w is None or w.usable(now) for w in self.workers)

    # -- slots -----------------------------------------------------------------------------
    def _notify(self) -> None:
        self._waiters.wake_all()

    async def _wait(self) -> None:
        await self._waiters.wait()

    async def acquire(self) -> WorkerProcess:
        while True:
            if self._closing:
                raise errors.Closed("the engine is shutting down")
            now = asyncio.get_running_loop().time()
            for w in self.workers:
                if w is not None and w.usable(now) and not w.busy:
                    w.busy = True
                    return w
            await self._wait()

    def release(self, slot: Any) -> None:
        # A batch abandoned by its requests (deadline, disconnect) may still be running in
        # the worker: the slot is free only when it ended (_call_ended).
        w: WorkerProcess = slot
        if not w.batch_running():
            w.busy = False
            self._notify()

    def _call_ended(self, w: WorkerProcess, call: _Call) -> None:
        if call.kind != "stream" and w.busy and not w.batch_running():
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
    def _describe(self, arr: np.ndarray, call: _Call) -> TensorDesc:
        arena = self.arena
        if arr.dtype == object:
            items = arr.reshape(-1)
            n = bytes_tensor_size(items)
            lease = arena.allocate(n)
            call.leases.append(lease)
            write_bytes_tensor(list(items), lease.view)
            metrics.count_copy("process_input", n)
            return TensorDesc(lease.offset, n, BYTES, (len(items),))
        off = arena_offset(arr, arena.address, arena.size)
        if off is not None:
            owner = arena.lease_containing(off, arr.nbytes)
            if owner is not None:
                call.leases.append(owner.retain())
                return TensorDesc(off, arr.nbytes, arr.dtype.str, arr.shape)
        lease = arena.allocate(arr.nbytes)
        call.leases.append(lease)
        if arr.nbytes:
            flat = np.ascontiguousarray(arr).reshape(-1).view(np.uint8)
            np.frombuffer(lease.view, dtype=np.uint8)[:] = flat
            metrics.count_copy("process_input", arr.nbytes)
        return TensorDesc(lease.offset, arr.nbytes, arr.dtype.str, arr.shape)

    async def _roundtrip(self, w: WorkerProcess, call: _Call, msg: Any) -> Any:
        self._register(w, call)
        w.send(msg)
        try:
            return await call.future
        except asyncio.CancelledError:
            if call.id in w.calls and not call.abandoned:
                call.abandoned = True
                w.send(p.Abort(call.id))
            raise

    async def infer(
        self, slot: Any, batch: list[Mapping[str, Any]], *, deadline_at: float | None = None
    ) -> list[InferResult | BaseException]:
        w: WorkerProcess = slot
        call = _Call(next(self._ids), "infer", deadline_at)
        results: list[InferResult | BaseException] = []
        sent: list[dict[str, TensorDesc]] = []
        index: list[int] = []
        for i, inputs in enumerate(batch):
            try:
                validate_inputs(inputs)
                sent.append(
                    {k: self._describe(as_array(v, name=k), call) for k, v in inputs.items()}
                )
                index.append(i)
                results.append(WorkerError("unreachable"))
            except Exception as exc:  # this request's preprocessing failed: it alone
                results.append(exc)
        if not sent:
            call.release()
            return results
        outs: list[InferResult] = await self._roundtrip(w, call, p.Infer(call.id, sent))
        for i, out in zip(index, outs, strict=True):
            results[i] = out
        return results

    async def embed(
        self, slot: Any, texts: list[str], *, deadline_at: float | None = None
    ) -> np.ndarray:
        w: WorkerProcess = slot
        call = _Call(next(self._ids), "embed", deadline_at)
        out: np.ndarray = await self._roundtrip(w, call, p.Embed(call.id, texts))
        return out

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
        now = _loop_now()
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
