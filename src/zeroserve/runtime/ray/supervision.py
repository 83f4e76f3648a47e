"""A Ray executor's supervision: its workers' faults and restarts, hung work, links, and
the cluster itself (docs/architecture.md, "Executors: ray", "Hung work").

Strategy
--------
* Faults: a Ray actor error on a call marks that worker down (``ready()`` false,
  admission loses its slot), fails the call with ``WorkerError(503)``, and a recovery
  task pings the actor (``hello``, ``PING_TIMEOUT_S``) with the restart back-off until
  Ray has restarted it (``max_restarts``), then marks it up again. "Restarted" means a
  new start answered: ``hello`` returns a per-start ``instance``, and the start that went
  down may still answer one (``ray.kill`` is asynchronous).
* Links: an attached actor that serves a link is reached through it (``connect``); the
  link ending is the actor's death as a process worker's EOF is (its calls fail with
  503, recovery links the new start, or the same start again when only the link was
  lost). A protocol error on the link kills the actor. The supervisor is each link's
  ``LinkOwner``.
* Hung calls: an actor's call whose thread is still running keeps its Ray task pending
  (``RayWorker._call``), even once the caller gave up. A batch or embedding call still
  pending ``hang_grace_s`` after its caller gave up (its deadline, or a disconnect before
  it: the grace starts at min(deadline, now)) marks its actor down, which is killed for
  Ray to restart (the fault path above; counted ``reclaimed``, logged with the model's
  name). A stream is watched the same way once its consumer is gone (aborted: deadline
  or disconnect): the actor's stream ends only when its step in progress returned
  (``RayWorker.generate``), so a stream whose Ray generator has not finished
  ``hang_grace_s`` after it was abandoned has a step that does not return, and its actor
  is reclaimed alike. A hung call on a link is found by the link's hang timer
  (docs/decisions/0025-abandoned-work-grace-starts-at-abandonment.md).
* A lost cluster: a watch task probes the GCS and this node's raylet
  (``cluster.reachable``, every ``cluster.PROBE_INTERVAL_S``). While they are gone the
  executor is not ready and has no capacity, so admission answers ``ClusterUnavailable``
  (503, ``Retry-After``) at once; calls in flight fail with it (``race``) and open streams
  are cut with it. A cluster that comes back (the same GCS address) makes the executor
  usable again, and the workers' own recovery takes it from there.

Invariants
----------
* A worker is recovered by one task at a time: recovery starts only when it goes from
  ready to down.
* No Ray call is made while the cluster is gone or the executor is closing.
"""

from __future__ import annotations

import asyncio
import logging
import socket
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

import msgspec

from ... import errors
from ...errors import WorkerError
from ..worker import wire
from ..worker.link import Call, WorkerLink
from . import cluster
from .marshal import SITES
from .roster import RayWorkerHandle, Roster

if TYPE_CHECKING:
    from ..options import RuntimeOptions

log = logging.getLogger("zeroserve.runtime.ray")

# How long opening a link to an attached actor may take (connect, token, its Ready).
LINK_TIMEOUT_S = 5.0

# How long one health ping of a restarting actor may take before it counts as failed.
# Ray restarts an actor in about a second on an idle machine; 5 s covers a loaded one.
PING_TIMEOUT_S = 5.0


class WatchedStream(Protocol):
    """A stream on Ray calls whose consumer is gone, watched for a step that hangs."""

    @property
    def deadline_at(self) -> float | None: ...

    @property
    def task(self) -> asyncio.Task[None]: ...

    @property
    def worker(self) -> RayWorkerHandle | None: ...

    @property
    def instance(self) -> str: ...


class Supervisor:
    """Faults, restarts, hung work, links and the cluster watch of one Ray executor."""

    def __init__(self, roster: Roster) -> None:
        self.roster = roster
        self.tasks: set[asyncio.Task[None]] = set()  # the watch and the recoveries
        self.restarts = 0
        self.crashes = 0
        self.reclaimed = 0

    def _spawn(self, coro: Any) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    def stop(self) -> None:
        """The executor closes: cancel the watch and every recovery."""
        for t in list(self.tasks):
            t.cancel()

    # -- the cluster -----------------------------------------------------------------------
    def start_watch(self, probed: Callable[[], None]) -> None:
        """Probe the cluster from now on; ``probed`` runs after each probe it answered
        (a Serve deployment's health is read there)."""
        self._spawn(self._watch(probed))

    async def _watch(self, probed: Callable[[], None]) -> None:
        roster = self.roster
        while not roster.closing:
            await asyncio.sleep(cluster.PROBE_INTERVAL_S)
            up = await cluster.reachable()
            if up != roster.cluster_up and not roster.closing:
                self._set_cluster(up)
            if up and not roster.closing:
                probed()

    def _set_cluster(self, up: bool) -> None:
        roster = self.roster
        roster.cluster_up = up
        if up:
            log.warning("model %r: the Ray cluster is reachable again", roster.spec.name)
        else:
            log.warning("model %r: the Ray cluster is unreachable", roster.spec.name)
            for w in roster.handles:
                for fut in list(w.tasks):
                    fut.cancel()  # its caller gets ClusterUnavailable (``race``)
            err = roster.unreachable()
            for p in list(roster.streams):
                p.lose(err)
        roster.notify()

    async def race(self, fut: asyncio.Future[Any]) -> Any:
        """``fut``'s result (``fut`` is in a worker's ``tasks``), or ``ClusterUnavailable``
        once the cluster is lost (``_set_cluster`` cancels every such ``fut``); cancelling
        the caller leaves ``fut`` running."""
        try:
            return await asyncio.shield(fut)
        except asyncio.CancelledError:
            if fut.cancelled() and not self.roster.cluster_up:
                raise self.roster.unreachable() from None
            raise

    # -- faults ----------------------------------------------------------------------------
    def failure(self, w: RayWorkerHandle, exc: BaseException) -> BaseException:
        """The error a caller gets for ``exc`` raised by a Ray call on ``w``; an actor
        failure also marks ``w`` down and starts its recovery."""
        import ray.exceptions as rex

        if isinstance(exc, errors.ZeroserveError):
            return exc
        if isinstance(exc, rex.RayActorError | rex.RaySystemError | rex.ObjectLostError):
            if w.ready and not self.roster.closing:
                w.ready = False
                self.crashes += 1
                self.start_recovery(w)
            return WorkerError(
                f"Ray actor {w.pid} of model {self.roster.spec.name!r} died while serving "
                "this request",
                status=503,
            )
        return WorkerError(f"Ray call failed: {type(exc).__name__}", status=500)

    def start_recovery(self, w: RayWorkerHandle, *, same_start: bool = False) -> None:
        """``w`` is down: wait, in a task of this executor's, for Ray to restart it (or,
        ``same_start``, for its actor to answer again: its link was lost)."""
        self._spawn(self._recover(w, same_start))

    async def _recover(self, w: RayWorkerHandle, same_start: bool = False) -> None:
        """Mark ``w`` up once a new start of its actor answers ``hello``. The start that
        went down may still answer one (``ray.kill`` is asynchronous): that is not a
        restart, and calls sent to it would meet its death. After a lost link
        (``same_start``) the same start answering is alive: it is linked again, or
        killed for Ray to restart if that fails."""
        import ray.exceptions as rex

        options, roster = self.roster.options, self.roster
        delay = options.restart_backoff_s
        gone = w.instance
        while not roster.closing:
            try:
                answer = await asyncio.wait_for(w.actor.hello.remote(), PING_TIMEOUT_S)
            except (TimeoutError, rex.RayActorError, rex.RaySystemError):
                answer = None
            restarted = answer is not None and answer[2] != gone
            if answer is not None and (restarted or same_start):
                w.hello(answer)
                await self.connect(w)
                if restarted or w.link is not None:
                    w.ready = True
                    if restarted:
                        self.restarts += 1
                    roster.notify()
                    return
                same_start = False  # alive, but it takes no link: restart it
                self.kill(w)
            await asyncio.sleep(delay)
            delay = min(delay * 2, options.max_restart_backoff_s)

    def kill(self, w: RayWorkerHandle) -> None:
        """Kill ``w``'s actor for Ray to restart it (a no-op once it is gone)."""
        import ray

        try:
            ray.kill(w.actor, no_restart=False)
        except Exception:  # already gone: its recovery still waits for the restart
            pass

    # -- links -----------------------------------------------------------------------------
    async def connect(self, w: RayWorkerHandle) -> None:
        """Open a link to ``w``'s actor when it serves one (attached, ``linkable``): from
        then on its batches and streams go through the link, not through Ray calls. A link
        that cannot be opened (another network namespace, say) leaves the actor on Ray
        calls."""
        if not (w.linkable and w.attached and w.address):
            return
        roster = self.roster
        loop = asyncio.get_running_loop()
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.setblocking(False)
        try:
            await asyncio.wait_for(loop.sock_connect(sock, w.address), LINK_TIMEOUT_S)
            reader, writer = await asyncio.open_unix_connection(sock=sock)
            writer.write(wire.frame(wire.Link(roster.arena.token)))
            msg = wire.TO_SERVER.decode(
                await asyncio.wait_for(wire.read_frame(reader), LINK_TIMEOUT_S)
            )
            if not isinstance(msg, wire.Ready):
                raise ConnectionError(f"unexpected first frame {type(msg).__name__}")
        except (OSError, TimeoutError, asyncio.IncompleteReadError, msgspec.DecodeError) as exc:
            sock.close()
            log.warning(
                "model %r: no link to Ray actor %d (%s: %s); its calls go through Ray",
                roster.spec.name,
                w.pid,
                type(exc).__name__,
                exc,
            )
            return
        link = WorkerLink(self, roster.arena, w.index, reader, writer, sock, msg.pid, SITES)
        w.link = link
        link.task = loop.create_task(self._read_link(w, link))

    async def _read_link(self, w: RayWorkerHandle, link: WorkerLink) -> None:
        failure = await link.read()
        roster = self.roster
        if roster.closing:
            return
        if w.link is link:
            w.link = None
        if link.busy:  # its batch slot waited for the batch's end, which is now
            link.busy = False
            w.batches -= 1
        await link.aclose()
        link.fail_calls(
            WorkerError(
                f"Ray actor {link.pid} of model {roster.spec.name!r} died while serving this "
                "request",
                status=503,
            )
        )
        if failure is not None:  # a protocol error: the actor is not trustworthy
            log.warning(
                "model %r: link protocol error from Ray actor %d", roster.spec.name, link.pid
            )
            self.kill(w)
        if w.ready:
            w.ready = False
            if not link.hung:
                self.crashes += 1
            self.start_recovery(w, same_start=failure is None)
        roster.notify()

    # -- LinkOwner -------------------------------------------------------------------------
    @property
    def options(self) -> RuntimeOptions:
        return self.roster.options

    def call_ended(self, link: WorkerLink, call: Call) -> None:
        if call.kind != "stream" and link.busy and not link.batch_running():
            link.busy = False  # the batch its caller gave up on ended: the slot is free
            self.roster.handles[link.index].batches -= 1
        self.roster.notify()

    def hung(self, link: WorkerLink, call: Call) -> None:
        w = self.roster.handles[link.index]
        if w.link is link:
            link.hung = True
            self.reclaim(w, call.kind)

    # -- hung work -------------------------------------------------------------------------
    def watch_call(
        self, w: RayWorkerHandle, fut: asyncio.Future[Any], deadline_at: float | None
    ) -> None:
        """Watch a call its caller abandoned now: still running ``hang_grace_s`` after
        min(``deadline_at``, now), its actor is reclaimed (``reclaim``)."""
        loop = asyncio.get_running_loop()
        when = _abandoned_at(deadline_at, loop.time()) + self.roster.options.hang_grace_s
        timer = loop.call_at(when, self._hung, w, fut)

        def ended(f: asyncio.Future[Any]) -> None:
            timer.cancel()
            if not f.cancelled():
                f.exception()  # retrieved: the caller is gone

        fut.add_done_callback(ended)

    def _hung(self, w: RayWorkerHandle, fut: asyncio.Future[Any]) -> None:
        if not fut.done():
            self.reclaim(w, "call")

    def watch_stream(self, p: WatchedStream) -> None:
        """Watch a stream whose consumer is gone now (``p`` aborted): its actor's stream
        still running ``hang_grace_s`` after min(the stream's deadline, now) is hung. A
        stream without a deadline (a Serve deployment's) is not watched."""
        if p.deadline_at is None or p.task.done():
            return
        loop = asyncio.get_running_loop()
        when = _abandoned_at(p.deadline_at, loop.time()) + self.roster.options.hang_grace_s
        timer = loop.call_at(when, self._stream_hung, p)
        p.task.add_done_callback(lambda _: timer.cancel())

    def _stream_hung(self, p: WatchedStream) -> None:
        w = p.worker
        # Ended, or started on an earlier start of the actor (which took it along).
        if not p.task.done() and w is not None and w.instance == p.instance:
            self.reclaim(w, "stream")

    def reclaim(self, w: RayWorkerHandle, what: str) -> None:
        """A ``what`` ("call", "stream") on ``w`` is still running ``hang_grace_s`` past
        its deadline or its abandonment: kill its actor for Ray to restart, and wait for
        the restart."""
        roster = self.roster
        if not w.ready or roster.closing or not roster.cluster_up:
            return  # its actor is already down (recovering) or going
        log.warning(
            "model %r: a %s on Ray actor %d is still running %.1f s past its deadline or "
            "its abandonment; killing the actor for Ray to restart",
            roster.spec.name,
            what,
            w.pid,
            roster.options.hang_grace_s,
        )
        self.reclaimed += 1
        w.ready = False
        roster.notify()
        self.kill(w)
        self.start_recovery(w)


def _abandoned_at(deadline_at: float | None, now: float) -> float:
    """When abandoned work's grace starts: now, or its deadline if that passed already."""
    return now if deadline_at is None else min(deadline_at, now)
