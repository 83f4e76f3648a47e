"""The ``ray`` executor's fleet: a model's ``workers`` as named Ray actors, one
:class:`~.actor.RayWorker` each (docs/architecture.md, "Executors: ray").

Strategy
--------
* Created: ``workers`` actors named ``<ingress pid>-<model>-<index>`` (``actor_name``)
  with the placement's options and this process's :class:`~.actor.ArenaRef`, so an actor
  on this node attaches the arena; each then answers ``hello`` and, attached, is linked
  (``Supervisor.connect``). Closing kills them (unless the cluster is gone).
* Addressed: a linked actor through its link (the executor's), any other by a Ray call
  per batch (``call``): attached, descriptors in and out; detached, the object store
  (:mod:`.marshal`). Streams are the actor's own streaming generator (:class:`ActorFeed`),
  credit and abort sent to the actor.
* Scaled: fixed. A batch goes to a ready actor with fewer batches in flight than its depth
  (``PIPELINE_DEPTH`` on Ray calls, one on a link), attached first, then the fewest calls
  in flight; the actor runs them one at a time (``RayWorker.serial_batches``), so the
  second only hides a Ray round trip behind the model's work on the first.
* Health-checked: the executor serves while every actor is up; Ray restarts a dead one
  (``max_restarts``) and the supervisor's recovery takes it back. A call abandoned by its
  caller is watched for hanging from then on (``Supervisor.watch_call``). The fleet has
  capacity while an actor is up and (linked) not running a call past its deadline; with
  none, admission answers 503 ("restarting", or the hung answer) at the head.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator, Callable
from typing import Any

import msgspec
import numpy as np

from ... import errors
from ...errors import ModelLoadError
from ...models.base import GenerateRequest
from .. import contract
from ..arena import Arena, Lease
from ..channel import Channel
from ..classes import Priority
from ..contract import Producer
from ..results import InferResult, WorkerStatistics
from ..worker import wire
from ..worker.link import loop_now
from . import actor as a
from . import marshal
from .producer import RayProducer
from .roster import RayWorkerHandle, Roster
from .supervision import Supervisor

# Whether Ray records our actors' calls as task events (for its state API and dashboard).
# Off: every call is a request on the hot path, and the events cost CPU in the ingress,
# the actor and the GCS, about 0.2 ms per call on this machine's cores (a bare actor
# round trip, measured: 1.73 ms of CPU with events, 1.51 ms without).
TASK_EVENTS = False


def actor_name(model: str, index: int) -> str:
    """The Ray name of a model's ``index``-th actor in the ``zeroserve`` namespace: unique
    per ingress process, so operators (and tests) can find it with ``ray.get_actor``."""
    return f"{os.getpid()}-{model}-{index}"


class ActorFeed:
    """A stream on Ray calls to the actor running it: its streaming ``generate``, and
    credit and abort to the same actor."""

    __slots__ = ("arena",)

    def __init__(self, arena: Arena) -> None:
        self.arena = arena

    def control(self, w: RayWorkerHandle) -> Any:
        return w.actor

    async def items(
        self,
        w: RayWorkerHandle,
        rid: int,
        req: GenerateRequest,
        window: int,
        leases: list[Lease],
    ) -> AsyncIterator[tuple[str, Any]]:
        raw, raw_bytes = marshal.stream_raw(self.arena, req, leases, w.attached)
        encoded = msgspec.msgpack.encode(msgspec.structs.replace(req, raw=None))
        gen = w.actor.generate.options(num_returns="streaming").remote(
            rid, encoded, raw, raw_bytes, window
        )
        async for ref in gen:
            yield await ref

    def cancel(self) -> None:
        """Nothing: the abort reaches the actor, which ends its generator."""

    def closed(self, rid: int) -> None:
        """Nothing: the actor forgets a stream when its generator ends."""


class ActorFleet:
    """The ``ray`` executor's workers: named Ray actors, restarted by Ray."""

    kind = "ray"

    def __init__(self, roster: Roster, supervisor: Supervisor) -> None:
        self.roster = roster
        self.supervisor = supervisor

    # -- created ---------------------------------------------------------------------------
    async def start(self, timeout: float) -> None:
        """Create the actors and wait for each to load (``hello``); a load that fails or
        times out is a ``ModelLoadError`` (the executor then closes)."""
        import ray

        roster = self.roster
        spec, placement = roster.spec, roster.placement
        cls = ray.remote(a.RayWorker)
        arena: a.ArenaRef | None = None
        if placement.same_node == "auto":
            ours = roster.arena
            arena = a.ArenaRef(os.getpid(), ours.fd, ours.size, ours.token)
        for i in range(spec.workers):
            actor = cls.options(  # type: ignore[attr-defined]
                name=actor_name(spec.name, i),
                enable_task_events=TASK_EVENTS,
                **placement.actor_options(),
            ).remote(spec.factory, dict(spec.options), spec.name, arena)
            roster.handles.append(RayWorkerHandle(i, actor))
        try:
            hellos = await asyncio.wait_for(
                asyncio.gather(*(w.actor.hello.remote() for w in roster.handles)), timeout
            )
        except BaseException as exc:
            if isinstance(exc, TimeoutError):
                raise ModelLoadError(spec.name, f"actors did not load in {timeout} s") from exc
            raise ModelLoadError(spec.name, f"{type(exc).__name__}: {exc}") from exc
        for w, answer in zip(roster.handles, hellos, strict=True):
            w.hello(answer)
            await self.supervisor.connect(w)
            w.ready = True

    async def close(self) -> None:
        """Close every link and kill every actor (they went with a lost cluster)."""
        import ray

        roster = self.roster
        for w in roster.handles:
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
            if not roster.cluster_up:  # nothing to kill them with; they went with it
                continue
            try:
                ray.kill(w.actor, no_restart=True)
            except Exception:  # the actor or the cluster is already gone
                pass

    # -- health-checked --------------------------------------------------------------------
    def serving(self) -> bool:
        handles = self.roster.handles
        return bool(handles) and all(w.ready for w in handles)

    def probed(self) -> None:
        """Nothing to read: the actors' health is their calls' and the recovery's."""

    def has_capacity(self) -> bool:
        now = loop_now()
        return any(w.usable(now) for w in self.roster.handles)

    def unavailable(self) -> errors.ZeroserveError | None:
        handles = self.roster.handles
        down = sum(1 for w in handles if not w.ready)
        if down == 0 or self.has_capacity():
            return None  # every actor runs work past its deadline: the hung answer
        return contract.restarting(
            f"model {self.roster.spec.name!r} has no worker to take this request: {down} of "
            f"{len(handles)} Ray actors restarting; retry later"
        )

    # -- scaled ----------------------------------------------------------------------------
    async def acquire(self, priority: Priority, arrived: float) -> RayWorkerHandle:
        return await self.roster.take(self._take_batch, priority, arrived)

    def _take_batch(self) -> RayWorkerHandle | None:
        w = self.roster.batch_worker()
        if w is not None:
            w.batches += 1
        return w

    def release(self, w: RayWorkerHandle) -> None:
        if w.link is not None and w.link.batch_running():
            # A batch abandoned by its requests (deadline, disconnect) still runs in the
            # actor: its slot is free when it ended (call_ended), as a process worker's.
            w.link.busy = True
            return
        w.batches -= 1
        self.roster.notify()

    # -- addressed -------------------------------------------------------------------------
    async def call(self, w: RayWorkerHandle, ref: Any, deadline_at: float | None = None) -> Any:
        """Await one Ray call on ``w``; cancelling the caller cancels the actor's task.
        A call its caller abandoned (``deadline_at``, loop time, or a disconnect) and still
        running ``hang_grace_s`` after min(deadline, abandonment) is hung
        (``Supervisor.watch_call``)."""
        import ray

        fut = asyncio.ensure_future(ref)
        w.tasks.add(fut)
        w.outstanding += 1
        try:
            return await self.supervisor.race(fut)
        except asyncio.CancelledError:
            try:
                ray.cancel(ref)
            except Exception:
                pass
            if not fut.done():
                self.supervisor.watch_call(w, fut, deadline_at)
            raise
        except BaseException as exc:
            raise self.supervisor.failure(w, exc) from None
        finally:
            w.outstanding -= 1
            w.tasks.discard(fut)

    async def infer_arrays(
        self,
        w: RayWorkerHandle,
        arrays: list[dict[str, np.ndarray]],
        deadline_at: float | None,
    ) -> list[InferResult]:
        """Run the valid part of a batch on ``w`` by Ray calls."""
        if w.attached:
            rid = next(self.roster.ids)
            return await marshal.infer_attached(
                self.roster.arena, self.call, w, rid, arrays, deadline_at
            )
        return await marshal.infer_detached(self.call, w, arrays, deadline_at)

    def generate(
        self,
        req: GenerateRequest,
        channel: Channel,
        deadline_at: float | None,
        on_start: Callable[[], None] | None,
    ) -> Producer:
        feed = ActorFeed(self.roster.arena)
        return RayProducer(self.roster, self.supervisor, feed, req, channel, on_start, deadline_at)

    def statistics(self) -> WorkerStatistics:
        handles, supervisor = self.roster.handles, self.supervisor
        return WorkerStatistics(
            executor=self.kind,
            workers=len(handles),
            ready=sum(1 for w in handles if w.ready),
            busy=sum(1 for w in handles if w.batches),
            streams=sum(
                w.outstanding + (w.link.streams if w.link is not None else 0) for w in handles
            ),
            restarts=supervisor.restarts,
            crashes=supervisor.crashes,
            reclaimed=supervisor.reclaimed,
            linked=sum(1 for w in handles if w.link is not None),
        )
