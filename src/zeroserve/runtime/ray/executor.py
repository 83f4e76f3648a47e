"""The ``ray`` executor: a model's workers are Ray actors (docs/architecture.md,
"Executors: ray").

Strategy
--------
The same contract as the ``process`` executor, with Ray deciding where each worker runs
and restarting it. Each worker is a :class:`~.actor.RayWorker` actor, created with this
process's :class:`~.actor.ArenaRef`:

* *attached* (the actor mapped our arena: same node): inputs travel as descriptors, the
  leases holding them retained for the call; outputs already in the arena come back as
  descriptors, others are written by the actor into leases allocated here (one more
  actor call, ``write``). Nothing of the payload is pickled.
* *detached* (another node, or ``same_node=never``): the batch goes into Ray's object
  store with one ``ray.put`` (counted ``copied_bytes{site="ray_put"}``) and the outputs
  come back through it (counted ``ray_get``); the model reads Ray's read-only views.

Routing: a batch goes to a ready actor with fewer than ``PIPELINE_DEPTH`` batches in
flight, attached ones first, then the fewest calls in flight; a stream to the ready actor
with the fewest calls in flight, attached first. The actor runs its batches one at a time
(``RayWorker.serial_batches``): the second one in flight only waits there, so the Ray
round trip of one batch overlaps the model's work on the other.

Streams are Ray streaming generators stepped under per-stream credits: ``window`` pieces
up front, then ``credit`` calls as the consumer takes pieces (``block``) or on receipt
(``coalesce``). Abort (disconnect, deadline) calls the actor's ``abort``.

Faults: a Ray actor error on a call marks that worker down (``ready()`` false, admission
loses its slot), fails its calls with ``WorkerError(503)``, and a recovery task pings
the actor until Ray has restarted it (``max_restarts``), then marks it up again.

Hung calls: an actor's call whose thread is still running keeps its Ray task pending
(``RayWorker._call``), even once the caller gave up. A batch or embedding call still
pending ``hang_grace_s`` past its deadline marks its actor down, which is killed for Ray
to restart (the crash path above; counted ``reclaimed``, logged with the model's name).
A stream is watched the same way once its consumer is gone (aborted: deadline or
disconnect): the actor's stream ends only when its step in progress returned
(``RayWorker.generate``), so a stream whose Ray generator has not finished
``hang_grace_s`` past the stream's deadline has a step that does not return, and its
actor is reclaimed alike.

A lost cluster: a watch task probes the GCS and this node's raylet
(``cluster.reachable``, every ``cluster.PROBE_INTERVAL_S``). While they are gone the
executor is not ready and has no capacity, so admission answers ``ClusterUnavailable``
(503, ``Retry-After``) at once; calls in flight fail with it and open streams are cut
with it. A cluster that comes back (the same GCS address) makes the executor usable
again, and the workers' own recovery takes it from there.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
import socket
from collections import deque
from collections.abc import AsyncIterator, Callable, Mapping
from typing import TYPE_CHECKING, Any, ClassVar

import msgspec
import numpy as np

from ... import errors, metrics
from ...errors import ClusterUnavailable, ModelLoadError, WorkerError, WouldBlock
from ...models.base import GenerateRequest
from ..arena import Arena, Lease
from ..channel import Channel
from ..contract import Executor, Producer
from ..inproc import validate_inputs
from ..results import InferResult, WorkerStatistics
from ..tensors import TensorDesc, as_array, from_desc
from ..waiters import Waiters
from ..worker import wire
from ..worker.link import (
    Call,
    CopySites,
    LinkStream,
    WorkerLink,
    describe,
    loop_now,
    rebuild_error,
)
from . import actor as a
from . import cluster
from .placement import Placement, parse_placement

if TYPE_CHECKING:
    from ..options import ResolvedModel, RuntimeOptions

log = logging.getLogger("zeroserve.runtime.ray")

# A Ray stream's credit window, in pieces: what the actor may produce ahead of the
# consumer. Wider than the channel (8 pieces), because each credit return is an actor call
# and each Ray stream item a round trip: the pieces beyond the channel wait in the
# producer's ``backlog`` (bounded by this window), credit goes back once half of it was
# consumed. 64 short pieces are a few KiB per stream.
STREAM_WINDOW = 64

# Batches in flight on one actor (its batch slots). The actor still runs them one at a
# time; the second is there to hide a Ray round trip (submission, the actor's task
# dispatch, the reply through Ray's event loop bridge: about 1.5 ms of CPU on this
# machine's cores, measured with a bare actor) behind the model's work on the first.
# Measured on the 4 MiB echo (8 s runs, each against the process executor measured just
# after): one slot 0.68x its req/s, two 0.78x; four no better than two once the core is
# saturated (docs/architecture.md, "Executors: ray").
PIPELINE_DEPTH = 2

# Whether Ray records our actors' calls as task events (for its state API and dashboard).
# Off: every call is a request on the hot path, and the events cost CPU in the ingress,
# the actor and the GCS, about 0.2 ms per call on this machine's cores (a bare actor
# round trip, measured: 1.73 ms of CPU with events, 1.51 ms without).
TASK_EVENTS = False

# Where a link counts its copies: the same sites as an attached actor's Ray calls.
SITES = CopySites(input="ray_input", output="ray_output")

# How long opening a link to an attached actor may take (connect, token, its Ready).
LINK_TIMEOUT_S = 5.0

# How long one health ping of a restarting actor may take before it counts as failed.
# Ray restarts an actor in about a second on an idle machine; 5 s covers a loaded one.
PING_TIMEOUT_S = 5.0


def actor_name(model: str, index: int) -> str:
    """The Ray name of a model's ``index``-th actor in the ``zeroserve`` namespace: unique
    per ingress process, so operators (and tests) can find it with ``ray.get_actor``."""
    return f"{os.getpid()}-{model}-{index}"


def _rebuild(fail: a.Failed) -> errors.ZeroserveError:
    return rebuild_error(fail.error, fail.message, fail.status)


class RayWorkerHandle:
    """This side of one actor: its handle, state and the calls in flight on it."""

    __slots__ = (
        "actor",
        "address",
        "attached",
        "batches",
        "index",
        "instance",
        "link",
        "outstanding",
        "pid",
        "ready",
        "tasks",
    )

    def __init__(self, index: int, actor: Any) -> None:
        self.index = index
        self.actor = actor
        self.attached = False
        self.pid = 0
        self.instance = ""  # which start of the actor answered its last ``hello``
        self.address = ""  # its link socket ("" when it serves none)
        self.link: WorkerLink | None = None  # the open link: every call goes through it
        self.ready = False
        self.batches = 0  # batch slots taken (PIPELINE_DEPTH, or 1 through a link)
        self.outstanding = 0
        self.tasks: set[asyncio.Future[Any]] = set()

    def hello(self, answer: tuple[int, bool, str, str]) -> None:
        self.pid, self.attached, self.instance, self.address = answer

    @property
    def depth(self) -> int:
        """Batches this actor may have in flight: a link's worker runs one at a time and
        costs no round trip to hide; Ray calls are pipelined (``PIPELINE_DEPTH``)."""
        return 1 if self.link is not None else PIPELINE_DEPTH

    def usable(self, now: float | None) -> bool:
        """Ready, and (through a link) not running a call past its deadline."""
        return self.ready and (self.link is None or self.link.usable(now))

    def rank(self) -> tuple[int, int]:
        calls = self.outstanding + (len(self.link.calls) if self.link is not None else 0)
        return (0 if self.attached else 1, calls)


class _RayProducer(Producer):
    def __init__(
        self,
        ex: RayExecutor,
        req: GenerateRequest,
        channel: Channel,
        on_start: Callable[[], None] | None = None,
        deadline_at: float | None = None,
    ) -> None:
        self.ex = ex
        self.channel = channel
        # Loop time; once aborted, a stream still running ``hang_grace_s`` past it is hung
        # (``RayExecutor._watch_stream``). None: not watched (the Serve executor's).
        self.deadline_at = deadline_at
        self.worker: RayWorkerHandle | None = None
        self.instance = ""  # the start of the worker's actor that runs this stream
        self.rid = next(ex._ids)
        self.aborted = False
        self.credit = 0
        self.window = max(channel.capacity, STREAM_WINDOW)
        # Pieces received beyond what the channel holds, and the end of the stream (an
        # error or None, the result) once it arrived behind them.
        self.backlog: deque[Any] = deque()
        self.end: tuple[BaseException | None, Any] | None = None
        self.linked: LinkStream | None = None  # the stream runs on the actor's link
        self.task = asyncio.get_running_loop().create_task(self._run(req, on_start))
        ex._producers.add(self)
        self.task.add_done_callback(lambda _: ex._producers.discard(self))

    def lose(self, err: errors.ZeroserveError) -> None:
        """The cluster is gone: cut the stream with ``err`` and stop waiting for Ray."""
        self.aborted = True
        self.backlog.clear()
        if not self.channel.closed:
            self.channel.abort(err)
        if self.linked is not None:
            self.linked.abort()
        self.task.cancel()

    def _control(self) -> Any:
        """The Ray actor taking this stream's ``credit`` and ``abort`` calls: the one
        running it (the Serve executor's streams have a control actor instead)."""
        assert self.worker is not None
        return self.worker.actor

    def _return_credit(self, n: int) -> None:
        if self.worker is None or self.aborted or self.end is not None:
            return
        self.credit += n
        if self.credit >= self.window // 2:
            self._control().credit.remote(self.rid, self.credit)
            self.credit = 0

    def _taken(self, n: int) -> None:
        """The consumer took ``n`` pieces (``block``): refill the channel from the
        backlog, then return the credit."""
        if self.backlog or self.end is not None:
            self._flush()
        self._return_credit(n)

    def _flush(self) -> None:
        channel, backlog = self.channel, self.backlog
        while backlog:
            try:
                channel.send_nowait(backlog[0])
            except WouldBlock:
                return
            except errors.ZeroserveError:
                backlog.clear()
                self.abort()  # the consumer went away
                return
            backlog.popleft()
        if self.end is not None and not channel.closed:
            err, result = self.end
            channel.close(err, result=result)

    def _finish(self, err: BaseException | None, result: Any = None) -> None:
        """The actor's stream ended: close the channel behind the backlog."""
        self.end = (err, result)
        if not self.backlog:
            self.channel.close(err, result=result)

    def _raw(
        self, w: RayWorkerHandle, req: GenerateRequest, leases: list[Lease], attached: bool
    ) -> tuple[TensorDesc | None, bytes | None]:
        """The request's raw input as a descriptor into the arena (``attached``), or
        as bytes through Ray (counted ``ray_put``); None, None without one."""
        if req.raw is None:
            return None, None
        arr = as_array(req.raw, name="raw")
        if attached:
            return self.ex._describe(arr, leases), None
        raw_bytes = np.ascontiguousarray(arr).tobytes()
        metrics.count_copy("ray_put", len(raw_bytes))
        return None, raw_bytes

    async def _items(
        self, w: RayWorkerHandle, req: GenerateRequest, leases: list[Lease]
    ) -> AsyncIterator[tuple[str, Any]]:
        """The actor's stream items, ``(kind, value)`` (see ``actor.RayWorker.generate``)."""
        raw, raw_bytes = self._raw(w, req, leases, w.attached)
        encoded = msgspec.msgpack.encode(msgspec.structs.replace(req, raw=None))
        gen = w.actor.generate.options(num_returns="streaming").remote(
            self.rid, encoded, raw, raw_bytes, self.window
        )
        async for ref in gen:
            yield await ref

    def _closed(self) -> None:
        """The stream is over on this side (the Serve executor tells its control actor)."""

    async def _run(self, req: GenerateRequest, on_start: Callable[[], None] | None) -> None:
        ex, channel = self.ex, self.channel
        leases: list[Lease] = []
        w: RayWorkerHandle | None = None
        try:
            picked = await ex._pick(stream=True)
            if on_start is not None:  # an actor takes it: the queue wait is over
                on_start()
            if picked.link is not None:  # the worker protocol, as a process worker's
                self.linked = picked.link.start_stream(req, channel, self.deadline_at)
                return
            w = picked
            self.worker, self.instance = w, w.instance
            w.outstanding += 1
            if channel.policy == "block":
                channel.on_take = self._taken
            async for kind, value in self._items(w, req, leases):
                if kind == "e":
                    self._finish(None, value)
                    return
                if kind == "f":
                    self._finish(_rebuild(a.Failed(*value)))
                    return
                if self.aborted:
                    continue
                for _, piece in value if kind == "m" else [(kind, value)]:
                    if not self._send(piece):
                        break
            if not channel.closed and not self.aborted and self.end is None:
                channel.close(WorkerError("the actor's stream ended without a result"))
        except asyncio.CancelledError:
            raise
        except BaseException as exc:  # delivered through the channel, not the task
            err = ex._ray_failure(w, exc) if w is not None else exc
            if not channel.closed:
                channel.abort(err) if isinstance(err, errors.ZeroserveError) else channel.close(err)
        finally:
            for lease in leases:
                lease.release()
            if w is not None:
                w.outstanding -= 1
                self._closed()

    def _send(self, piece: Any) -> bool:
        """Pass one piece on (into the backlog while the channel is full); False once the
        stream is given up."""
        channel, backlog = self.channel, self.backlog
        try:
            if backlog:
                raise WouldBlock
            channel.send_nowait(piece)
        except WouldBlock:
            if len(backlog) >= self.window:
                self.abort()
                channel.abort(WorkerError("actor sent a piece beyond its credit"))
                return False
            backlog.append(piece)
            return True
        except errors.ZeroserveError:
            self.abort()  # consumer gone, or the coalesce cap passed
            return False
        if channel.policy == "coalesce":
            self._return_credit(1)
        return True

    def abort(self) -> None:
        if self.aborted:
            return
        self.aborted = True
        if self.linked is not None:
            self.linked.abort()  # the link watches it for hanging, as for any call
            return
        w = self.worker
        if w is None:
            self.task.cancel()
            return
        if w.ready:
            self._control().abort.remote(self.rid)
        self.ex._watch_stream(self)


class RayExecutor(Executor):
    kind = "ray"
    # Whether attached actors are reached through a link (the worker protocol over a
    # socket) rather than a Ray call per batch; Serve replicas are reached through handles.
    links: ClassVar[bool] = True

    def __init__(self, spec: ResolvedModel, arena: Arena, options: RuntimeOptions) -> None:
        super().__init__(spec, arena)
        self.options = options
        try:
            self.placement: Placement = parse_placement(spec.placement)
        except ValueError as exc:
            raise ModelLoadError(spec.name, str(exc)) from exc
        self.workers: list[RayWorkerHandle] = []
        self._ids = itertools.count(1)
        self._waiters = Waiters()
        self._tasks: set[asyncio.Task[None]] = set()
        self._connected = False
        self._closing = False
        self._started = False
        self.restarts = 0
        self.crashes = 0
        self.reclaimed = 0
        # The cluster watch (see the module doc): whether the cluster answered the last
        # probe, and the open streams.
        self._cluster_up = True
        self._producers: set[_RayProducer] = set()

    # -- lifecycle -----------------------------------------------------------------------
    async def start(self, timeout: float) -> None:
        loop = asyncio.get_running_loop()
        try:
            await loop.run_in_executor(None, cluster.connect, self.options.ray_address)
        except Exception as exc:
            raise ModelLoadError(self.spec.name, f"cannot join Ray: {exc}") from exc
        self._connected = True
        import ray

        cls = ray.remote(a.RayWorker)
        arena: a.ArenaRef | None = None
        if self.placement.same_node == "auto":
            arena = a.ArenaRef(os.getpid(), self.arena.fd, self.arena.size, self.arena.token)
        spec = self.spec
        for i in range(spec.workers):
            actor = cls.options(  # type: ignore[attr-defined]
                name=actor_name(spec.name, i),
                enable_task_events=TASK_EVENTS,
                **self.placement.actor_options(),
            ).remote(spec.factory, dict(spec.options), spec.name, arena)
            self.workers.append(RayWorkerHandle(i, actor))
        try:
            hellos = await asyncio.wait_for(
                asyncio.gather(*(w.actor.hello.remote() for w in self.workers)), timeout
            )
        except BaseException as exc:
            await self.aclose()
            if isinstance(exc, TimeoutError):
                raise ModelLoadError(spec.name, f"actors did not load in {timeout} s") from exc
            raise ModelLoadError(spec.name, f"{type(exc).__name__}: {exc}") from exc
        for w, answer in zip(self.workers, hellos, strict=True):
            w.hello(answer)
            await self._connect(w)
            w.ready = True
        self._started = True
        self._start_watch()
        self._notify()

    def _start_watch(self) -> None:
        task = asyncio.get_running_loop().create_task(self._watch())
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _watch(self) -> None:
        while not self._closing:
            await asyncio.sleep(cluster.PROBE_INTERVAL_S)
            up = await cluster.reachable()
            if up != self._cluster_up and not self._closing:
                self._set_cluster(up)
            if up and not self._closing:
                self._probed()

    def _probed(self) -> None:
        """The cluster answered the watch's probe (the Serve executor reads its
        deployment's health here)."""

    def _set_cluster(self, up: bool) -> None:
        self._cluster_up = up
        if up:
            log.warning("model %r: the Ray cluster is reachable again", self.spec.name)
        else:
            log.warning("model %r: the Ray cluster is unreachable", self.spec.name)
            for w in self.workers:
                for fut in list(w.tasks):
                    fut.cancel()  # its caller gets ClusterUnavailable (``_race``)
            err = self._unreachable()
            for p in list(self._producers):
                p.lose(err)
        self._notify()

    def _unreachable(self) -> ClusterUnavailable:
        return ClusterUnavailable(
            f"the Ray cluster of model {self.spec.name!r} is unreachable",
            retry_after=cluster.RETRY_AFTER_S,
        )

    def has_capacity(self) -> bool:
        return self._cluster_up

    def unavailable(self) -> errors.ZeroserveError | None:
        return None if self._cluster_up else self._unreachable()

    def ready(self) -> bool:
        return (
            self._started
            and not self._closing
            and self._cluster_up
            and bool(self.workers)
            and all(w.ready for w in self.workers)
        )

    async def aclose(self) -> None:
        if self._closing:
            return
        self._closing = True
        for t in list(self._tasks):
            t.cancel()
        import ray

        for w in self.workers:
            w.ready = False
            for fut in list(w.tasks):
                fut.cancel()
            link, w.link = w.link, None
            if link is not None:
                link.send(wire.Shutdown())
                if link.task is not None:
                    link.task.cancel()
                await link.aclose()
                link.fail_calls(errors.Closed("the engine is shutting down"))
            if not self._cluster_up:  # nothing to kill them with; they went with it
                continue
            try:
                ray.kill(w.actor, no_restart=True)
            except Exception:  # the actor or the cluster is already gone
                pass
        self._notify()
        if self._connected:
            self._connected = False
            await asyncio.get_running_loop().run_in_executor(None, cluster.disconnect)

    # -- faults ----------------------------------------------------------------------------
    def _ray_failure(self, w: RayWorkerHandle, exc: BaseException) -> BaseException:
        """The error a caller gets for ``exc`` raised by a Ray call on ``w``; an actor
        failure also marks ``w`` down and starts its recovery."""
        import ray.exceptions as rex

        if isinstance(exc, errors.ZeroserveError):
            return exc
        if isinstance(exc, rex.RayActorError | rex.RaySystemError | rex.ObjectLostError):
            if w.ready and not self._closing:
                w.ready = False
                self.crashes += 1
                self._start_recovery(w)
            return WorkerError(
                f"Ray actor {w.pid} of model {self.spec.name!r} died while serving this request",
                status=503,
            )
        return WorkerError(f"Ray call failed: {type(exc).__name__}", status=500)

    def _start_recovery(self, w: RayWorkerHandle, *, same_start: bool = False) -> None:
        """``w`` is down: wait, in a task of this executor's, for Ray to restart it (or,
        ``same_start``, for its actor to answer again: its link was lost)."""
        task = asyncio.get_running_loop().create_task(self._recover(w, same_start))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _recover(self, w: RayWorkerHandle, same_start: bool = False) -> None:
        """Mark ``w`` up once a new start of its actor answers ``hello``. The start that
        went down may still answer one (``ray.kill`` is asynchronous): that is not a
        restart, and calls sent to it would meet its death. After a lost link
        (``same_start``) the same start answering is alive: it is linked again, or
        killed for Ray to restart if that fails."""
        import ray.exceptions as rex

        delay = self.options.restart_backoff_s
        gone = w.instance
        while not self._closing:
            try:
                answer = await asyncio.wait_for(w.actor.hello.remote(), PING_TIMEOUT_S)
            except (TimeoutError, rex.RayActorError, rex.RaySystemError):
                answer = None
            restarted = answer is not None and answer[2] != gone
            if answer is not None and (restarted or same_start):
                w.hello(answer)
                await self._connect(w)
                if restarted or w.link is not None:
                    w.ready = True
                    if restarted:
                        self.restarts += 1
                    self._notify()
                    return
                same_start = False  # alive, but it takes no link: restart it
                self._kill(w)
            await asyncio.sleep(delay)
            delay = min(delay * 2, self.options.max_restart_backoff_s)

    def _kill(self, w: RayWorkerHandle) -> None:
        """Kill ``w``'s actor for Ray to restart it (a no-op once it is gone)."""
        import ray

        try:
            ray.kill(w.actor, no_restart=False)
        except Exception:  # already gone: its recovery still waits for the restart
            pass

    # -- links -----------------------------------------------------------------------------
    async def _connect(self, w: RayWorkerHandle) -> None:
        """Open a link to ``w``'s actor when it serves one (attached, ``links``): from then
        on its batches and streams go through the link, not through Ray calls. A link that
        cannot be opened (another network namespace, say) leaves the actor on Ray calls."""
        if not (self.links and w.attached and w.address):
            return
        loop = asyncio.get_running_loop()
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.setblocking(False)
        try:
            await asyncio.wait_for(loop.sock_connect(sock, w.address), LINK_TIMEOUT_S)
            reader, writer = await asyncio.open_unix_connection(sock=sock)
            writer.write(wire.frame(wire.Link(self.arena.token)))
            msg = wire.TO_SERVER.decode(
                await asyncio.wait_for(wire.read_frame(reader), LINK_TIMEOUT_S)
            )
            if not isinstance(msg, wire.Ready):
                raise ConnectionError(f"unexpected first frame {type(msg).__name__}")
        except (OSError, TimeoutError, asyncio.IncompleteReadError, msgspec.DecodeError) as exc:
            sock.close()
            log.warning(
                "model %r: no link to Ray actor %d (%s: %s); its calls go through Ray",
                self.spec.name,
                w.pid,
                type(exc).__name__,
                exc,
            )
            return
        link = WorkerLink(self, self.arena, w.index, reader, writer, sock, msg.pid, SITES)
        w.link = link
        link.task = loop.create_task(self._read_link(w, link))

    async def _read_link(self, w: RayWorkerHandle, link: WorkerLink) -> None:
        failure = await link.read()
        if self._closing:
            return
        if w.link is link:
            w.link = None
        if link.busy:  # its batch slot waited for the batch's end, which is now
            link.busy = False
            w.batches -= 1
        await link.aclose()
        link.fail_calls(
            WorkerError(
                f"Ray actor {link.pid} of model {self.spec.name!r} died while serving this request",
                status=503,
            )
        )
        if failure is not None:  # a protocol error: the actor is not trustworthy
            log.warning("model %r: link protocol error from Ray actor %d", self.spec.name, link.pid)
            self._kill(w)
        if w.ready:
            w.ready = False
            if not link.hung:
                self.crashes += 1
            self._start_recovery(w, same_start=failure is None)
        self._notify()

    # -- LinkOwner -----------------------------------------------------------------------------
    def call_ended(self, link: WorkerLink, call: Call) -> None:
        if call.kind != "stream" and link.busy and not link.batch_running():
            link.busy = False  # the batch its caller gave up on ended: the slot is free
            self.workers[link.index].batches -= 1
        self._notify()

    def hung(self, link: WorkerLink, call: Call) -> None:
        w = self.workers[link.index]
        if w.link is link:
            link.hung = True
            self._reclaim(w, call.kind)

    # -- slots -----------------------------------------------------------------------------
    def _notify(self) -> None:
        self._waiters.wake_all()

    async def _wait(self) -> None:
        await self._waiters.wait()

    async def _pick(self, *, stream: bool) -> RayWorkerHandle:
        while True:
            if self._closing:
                raise errors.Closed("the engine is shutting down")
            if not self._cluster_up:
                raise self._unreachable()
            now = loop_now()
            ready = [w for w in self.workers if w.usable(now) and (stream or w.batches < w.depth)]
            if ready:
                return min(ready, key=RayWorkerHandle.rank)
            await self._wait()

    async def acquire(self) -> RayWorkerHandle:
        w = await self._pick(stream=False)
        w.batches += 1
        return w

    def release(self, slot: Any) -> None:
        w: RayWorkerHandle = slot
        if w.link is not None and w.link.batch_running():
            # A batch abandoned by its requests (deadline, disconnect) still runs in the
            # actor: its slot is free when it ended (call_ended), as a process worker's.
            w.link.busy = True
            return
        w.batches -= 1
        self._notify()

    # -- work ------------------------------------------------------------------------------
    def _describe(self, arr: np.ndarray, leases: list[Lease]) -> TensorDesc:
        """``arr`` as a descriptor into the arena (copied in, counted, if not already)."""
        return describe(self.arena, arr, leases, SITES.input)

    async def _await(self, w: RayWorkerHandle, ref: Any, deadline_at: float | None = None) -> Any:
        """Await one Ray call on ``w``; cancelling the caller cancels the actor's task.
        ``deadline_at`` (loop time): a call still running ``hang_grace_s`` past it, the
        caller gone, is hung (``_watch_hung``)."""
        import ray

        fut = asyncio.ensure_future(ref)
        w.tasks.add(fut)
        w.outstanding += 1
        try:
            return await self._race(fut)
        except asyncio.CancelledError:
            try:
                ray.cancel(ref)
            except Exception:
                pass
            if deadline_at is not None and not fut.done():
                self._watch_hung(w, fut, deadline_at)
            raise
        except BaseException as exc:
            raise self._ray_failure(w, exc) from None
        finally:
            w.outstanding -= 1
            w.tasks.discard(fut)

    def _watch_hung(self, w: RayWorkerHandle, fut: asyncio.Future[Any], deadline_at: float) -> None:
        """Watch a call its caller abandoned: still running ``hang_grace_s`` past
        ``deadline_at``, its actor is reclaimed (``_reclaim``)."""
        loop = asyncio.get_running_loop()
        timer = loop.call_at(deadline_at + self.options.hang_grace_s, self._hung, w, fut)

        def ended(f: asyncio.Future[Any]) -> None:
            timer.cancel()
            if not f.cancelled():
                f.exception()  # retrieved: the caller is gone

        fut.add_done_callback(ended)

    def _hung(self, w: RayWorkerHandle, fut: asyncio.Future[Any]) -> None:
        if not fut.done():
            self._reclaim(w, "call")

    def _watch_stream(self, p: _RayProducer) -> None:
        """Watch a stream whose consumer is gone (``p`` aborted): its actor's stream
        still running ``hang_grace_s`` past the stream's deadline is hung."""
        if p.deadline_at is None or p.task.done():
            return
        loop = asyncio.get_running_loop()
        timer = loop.call_at(p.deadline_at + self.options.hang_grace_s, self._stream_hung, p)
        p.task.add_done_callback(lambda _: timer.cancel())

    def _stream_hung(self, p: _RayProducer) -> None:
        w = p.worker
        # Ended, or started on an earlier start of the actor (which took it along).
        if not p.task.done() and w is not None and w.instance == p.instance:
            self._reclaim(w, "stream")

    def _reclaim(self, w: RayWorkerHandle, what: str) -> None:
        """A ``what`` ("call", "stream") on ``w`` is still running ``hang_grace_s`` past
        its deadline: kill its actor for Ray to restart, and wait for the restart."""
        if not w.ready or self._closing or not self._cluster_up:
            return  # its actor is already down (recovering) or going
        log.warning(
            "model %r: a %s on Ray actor %d is still running %.1f s past its deadline; "
            "killing the actor for Ray to restart",
            self.spec.name,
            what,
            w.pid,
            self.options.hang_grace_s,
        )
        self.reclaimed += 1
        w.ready = False
        self._notify()
        self._kill(w)
        self._start_recovery(w)

    async def _race(self, fut: asyncio.Future[Any]) -> Any:
        """``fut``'s result (``fut`` is in a worker's ``tasks``), or ``ClusterUnavailable``
        once the cluster is lost (``_set_cluster`` cancels every such ``fut``); cancelling
        the caller leaves ``fut`` running."""
        try:
            return await asyncio.shield(fut)
        except asyncio.CancelledError:
            if fut.cancelled() and not self._cluster_up:
                raise self._unreachable() from None
            raise

    async def infer(
        self, slot: Any, batch: list[Mapping[str, Any]], *, deadline_at: float | None = None
    ) -> list[InferResult | BaseException]:
        w: RayWorkerHandle = slot
        if w.link is not None:
            return await w.link.infer(batch, deadline_at)
        results: list[InferResult | BaseException] = []
        index: list[int] = []
        arrays: list[dict[str, np.ndarray]] = []
        for i, inputs in enumerate(batch):
            try:
                validate_inputs(inputs)
                arrays.append({k: as_array(v, name=k) for k, v in inputs.items()})
                index.append(i)
                results.append(WorkerError("unreachable"))
            except Exception as exc:  # this request's preprocessing failed: it alone
                results.append(exc)
        if not arrays:
            return results
        outs = await self._infer_arrays(w, arrays, deadline_at)
        for i, out in zip(index, outs, strict=True):
            results[i] = out
        return results

    async def _infer_arrays(
        self,
        w: RayWorkerHandle,
        arrays: list[dict[str, np.ndarray]],
        deadline_at: float | None = None,
    ) -> list[InferResult]:
        """Run the valid part of a batch on ``slot`` (the Serve executor overrides it)."""
        if w.attached:
            return await self._infer_attached(w, arrays, deadline_at)
        return await self._infer_detached(w, arrays, deadline_at)

    async def _infer_attached(
        self, w: RayWorkerHandle, arrays: list[dict[str, np.ndarray]], deadline_at: float | None
    ) -> list[InferResult]:
        leases: list[Lease] = []
        rid = next(self._ids)
        try:
            descs = [{k: self._describe(v, leases) for k, v in item.items()} for item in arrays]
            reply = a.REPLY.decode(
                await self._await(
                    w, w.actor.infer.remote(rid, msgspec.msgpack.encode(descs)), deadline_at
                )
            )
            if isinstance(reply, a.NeedAlloc):
                try:
                    out_leases = [self.arena.allocate(n) for n in reply.sizes]
                except errors.Overloaded:
                    w.actor.write.remote(rid, [])
                    raise
                leases.extend(out_leases)
                reply = a.REPLY.decode(
                    await self._await(
                        w, w.actor.write.remote(rid, [lease.offset for lease in out_leases])
                    )
                )
            if isinstance(reply, a.Failed):
                raise _rebuild(reply)
            assert isinstance(reply, a.Done)
            if reply.copied:
                metrics.count_copy("ray_output", reply.copied)
            return [self._result(item, leases) for item in reply.outputs]
        finally:
            for lease in leases:
                lease.release()

    def _result(self, described: dict[str, TensorDesc], leases: list[Lease]) -> InferResult:
        outputs: dict[str, Any] = {}
        held: list[Lease] = []
        for key, desc in described.items():
            owner = next(
                (
                    lease
                    for lease in leases
                    if lease.offset <= desc.offset
                    and desc.offset + desc.length <= lease.offset + lease.block
                ),
                None,
            )
            if owner is None:
                for lease in held:
                    lease.release()
                raise WorkerError("actor described memory outside the request's leases")
            outputs[key] = from_desc(self.arena.view, desc)
            if all(owner is not h for h in held):
                held.append(owner.retain())
        return InferResult(outputs, held)

    async def _infer_detached(
        self, w: RayWorkerHandle, arrays: list[dict[str, np.ndarray]], deadline_at: float | None
    ) -> list[InferResult]:
        import ray

        metrics.count_copy("ray_put", sum(v.nbytes for item in arrays for v in item.values()))
        ref = await asyncio.get_running_loop().run_in_executor(None, ray.put, arrays)
        out = await self._await(w, w.actor.infer_arrays.remote(ref), deadline_at)
        if isinstance(out, bytes):
            reply = a.REPLY.decode(out)
            raise _rebuild(reply) if isinstance(reply, a.Failed) else WorkerError("bad reply")
        results: list[InferResult] = []
        for item in out:
            metrics.count_copy("ray_get", sum(np.asarray(v).nbytes for v in item.values()))
            results.append(InferResult(dict(item)))
        return results

    async def embed(
        self, slot: Any, texts: list[str], *, deadline_at: float | None = None
    ) -> np.ndarray:
        w: RayWorkerHandle = slot
        if w.link is not None:
            return await w.link.embed(texts, deadline_at)
        out = await self._await(w, w.actor.embed.remote(texts), deadline_at)
        if isinstance(out, bytes):
            reply = a.REPLY.decode(out)
            raise _rebuild(reply) if isinstance(reply, a.Failed) else WorkerError("bad reply")
        metrics.count_copy("ray_get", out.nbytes)
        vecs: np.ndarray = np.asarray(out)
        return vecs

    def generate(
        self,
        req: GenerateRequest,
        channel: Channel,
        *,
        deadline_at: float | None = None,
        on_start: Callable[[], None] | None = None,
    ) -> Producer:
        return _RayProducer(self, req, channel, on_start, deadline_at)

    def statistics(self) -> WorkerStatistics:
        return WorkerStatistics(
            executor=self.kind,
            workers=len(self.workers),
            ready=sum(1 for w in self.workers if w.ready),
            busy=sum(1 for w in self.workers if w.batches),
            streams=sum(
                w.outstanding + (w.link.streams if w.link is not None else 0) for w in self.workers
            ),
            restarts=self.restarts,
            crashes=self.crashes,
            reclaimed=self.reclaimed,
            linked=sum(1 for w in self.workers if w.link is not None),
        )
