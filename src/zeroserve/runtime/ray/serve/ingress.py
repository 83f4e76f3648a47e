"""The ingress side of ``executor=ray-serve``: the Ray executor's fleet when a model is
served by an autoscaling Ray Serve deployment (docs/architecture.md, "Elastic:
executor=ray-serve").

Strategy
--------
``serve_executor`` gives the one Ray executor a :class:`ServeFleet`, which says how this
executor's workers are

* created: Serve is started without its proxy and the model's application run
  (:mod:`.deployment`), plus the model's :class:`~.replica.StreamControl`; the
  deployment's handle is the executor's one worker (never linked). Closing deletes the
  application and kills the control.
* addressed: every call goes through the handle (``call``). A batch is one
  ``infer_once`` call with descriptors; a replica that did not attach (another node or
  user) answers ``None`` and the batch goes again through the object store (``ray_put``,
  counted) to ``infer_arrays``, the ``ray`` executor's detached path; with
  ``same_node=never`` it goes there at once. Serve's router prefers replicas on the
  caller's node, so the resend is paid only when the replica chosen is elsewhere. A
  stream is a streaming response of the handle (:class:`ServeFeed`), its credit and
  abort sent to the StreamControl; cancelling the response (disconnect, deadline) also
  cancels the replica's generator.
* scaled: by Serve, between ``min_replicas`` and ``max_replicas``; this side holds
  ``max_replicas * max_ongoing_requests`` batches in flight at most (what Serve would
  queue beyond).
* health-checked: readiness is the deployment's health as Serve reports it. After each
  cluster probe the fleet reads ``serve.status()`` every ``STATUS_INTERVAL_S``, on a
  thread (a blocking call to Serve's controller; one still running is not started
  again): the executor is ready while the deployment is healthy (``HEALTHY``, or
  scaling) with a replica running. A replica that dies fails the calls in flight on it
  (503; a stream is cut with an error event); Serve replaces it and ``/ready`` answers
  503 meanwhile. Admission refuses (503 "restarting", ``Retry-After``) only when the
  last successful read showed no running replica and ``min_replicas`` > 0: with
  ``min_replicas=0`` a request reaching the handle is what scales the deployment up from
  zero, and a failed read proves nothing. Hung calls are not reclaimed here: a hung
  call keeps its replica's thread and Serve's health checks, run on the replica's event
  loop, do not see it; restarts are Serve's (``restarts`` and ``crashes`` stay 0).
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import AsyncIterator, Callable
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import msgspec
import numpy as np

from .... import errors, metrics
from ....errors import ClusterUnavailable, ModelLoadError, WorkerError
from ....models.base import GenerateRequest
from ... import contract
from ...arena import Lease
from ...channel import Channel
from ...classes import Priority
from ...contract import Producer
from ...results import InferResult, WorkerStatistics
from .. import actor as a
from .. import marshal
from ..executor import RayExecutor
from ..producer import RayProducer
from ..roster import RayWorkerHandle, Roster
from ..supervision import Supervisor
from .deployment import (
    AUTOSCALING_KEYS,
    MISSING,
    Autoscaling,
    DeploymentHealth,
    app_name,
    build_app,
    parse_autoscaling,
    read_health,
    serve_lock,
    start_control,
    start_serve,
)

if TYPE_CHECKING:
    from ...arena import Arena
    from ...options import ResolvedModel, RuntimeOptions

log = logging.getLogger("zeroserve.runtime.ray")

# How often the executor reads its deployment's health from Serve (``serve.status()``,
# one call to Serve's controller): ``/ready`` follows Serve within about this.
STATUS_INTERVAL_S = 0.5
# How long closing waits for a health read in progress, and for one Serve handle's
# router to stop (its loop thread).
ROUTER_STOP_S = 10.0


def serve_executor(spec: ResolvedModel, arena: Arena, options: RuntimeOptions) -> RayExecutor:
    """The ``ray-serve`` executor: the Ray executor with a Serve deployment as its fleet.
    The autoscaling options are the deployment's; the rest of ``placement`` places the
    replicas, as for ``executor=ray``."""
    rest = {k: v for k, v in spec.placement.items() if k not in AUTOSCALING_KEYS}
    try:
        autoscaling = parse_autoscaling(spec.placement)
    except ValueError as exc:
        raise ModelLoadError(spec.name, str(exc)) from exc
    fleet = functools.partial(ServeFleet, autoscaling=autoscaling)
    return RayExecutor(replace(spec, placement=rest), arena, options, fleet)


class ServeFeed:
    """A stream through the deployment's handle; credit and abort through the model's
    StreamControl."""

    __slots__ = ("fleet", "response")

    def __init__(self, fleet: ServeFleet) -> None:
        self.fleet = fleet
        self.response: Any = None  # the streaming response in progress

    def control(self, w: RayWorkerHandle) -> Any:
        return self.fleet.control

    async def items(
        self,
        w: RayWorkerHandle,
        rid: int,
        req: GenerateRequest,
        window: int,
        leases: list[Lease],
    ) -> AsyncIterator[tuple[str, Any]]:
        fleet = self.fleet
        roster = fleet.roster
        encoded = msgspec.msgpack.encode(msgspec.structs.replace(req, raw=None))
        attached = roster.placement.same_node != "never"
        while True:
            raw, raw_bytes = marshal.stream_raw(roster.arena, req, leases, attached)
            self.response = fleet.stream_handle.generate_stream.remote(
                rid, encoded, raw, raw_bytes, window, fleet.control
            )
            try:
                async for kind, value in self.response:
                    if kind == "x":  # a replica elsewhere: resend the raw bytes
                        break
                    yield kind, value
                else:
                    return
            except asyncio.CancelledError:
                self.response.cancel()
                raise
            except errors.ZeroserveError:
                raise
            except Exception as exc:
                raise WorkerError(
                    f"Ray Serve stream of model {roster.spec.name!r} failed: {type(exc).__name__}",
                    status=503,
                ) from None
            attached = False

    def cancel(self) -> None:
        """Cancel the streaming response, which cancels the replica's generator."""
        if self.response is not None:
            self.response.cancel()

    def closed(self, rid: int) -> None:
        control = self.fleet.control
        if control is not None:
            control.close.remote(rid)


class ServeFleet:
    """The ``ray-serve`` executor's workers: one Serve deployment behind its handle."""

    kind = "ray-serve"

    def __init__(self, roster: Roster, supervisor: Supervisor, autoscaling: Autoscaling) -> None:
        self.roster = roster
        self.supervisor = supervisor
        self.autoscaling = autoscaling
        self.app = app_name(roster.spec.name)
        self.capacity = autoscaling.max_replicas * autoscaling.max_ongoing_requests
        self.in_flight = 0
        self._deployed = False
        self.control: Any = None
        self.stream_handle: Any = None
        # The deployment's health (see the module doc): serve.run returned, so it is
        # running when the executor starts; then as ``serve.status()`` reports it.
        self.health = DeploymentHealth(True, 1, 1)
        # Replicas running at the last read that answered (a failed read keeps it).
        self.running = 1
        self._reading: asyncio.Future[DeploymentHealth] | None = None
        self._next_read = 0.0

    # -- created ---------------------------------------------------------------------------
    async def start(self, timeout: float) -> None:
        """Deploy the model and wait for a replica to answer ``hello``; a deployment that
        fails or times out is a ``ModelLoadError`` (the executor then closes)."""
        loop = asyncio.get_running_loop()
        name = self.roster.spec.name
        try:
            handle = await asyncio.wait_for(loop.run_in_executor(None, self._deploy), timeout)
            pid, _, _, _, node = await asyncio.wait_for(handle.hello.remote(), timeout)
        except BaseException as exc:
            if isinstance(exc, TimeoutError):
                raise ModelLoadError(
                    name, f"the Serve deployment did not start in {timeout} s"
                ) from exc
            raise ModelLoadError(name, f"{type(exc).__name__}: {exc}") from exc
        self.stream_handle = handle.options(stream=True)
        w = RayWorkerHandle(0, handle, linkable=False)
        w.pid, w.node, w.attached, w.ready = pid, node, True, True
        self.roster.handles.append(w)

    def _deploy(self) -> Any:
        """Start Serve without its proxy and run this model's application (blocking).
        One model at a time: building a deployment is not thread-safe in Ray 2.60
        (it registers modules with cloudpickle, process-wide)."""
        from ray import serve

        roster = self.roster
        with serve_lock:
            start_serve()
            app = build_app(roster.spec, roster.placement, self.autoscaling, roster.arena)
            self._deployed = True
            self.control = start_control(self.app)
            return serve.run(app, name=self.app, route_prefix=None)

    async def close(self) -> None:
        """Fail the calls in flight, then delete the application and kill the control
        (a lost cluster took them with it). A health read still running on its thread is
        waited for: ``serve.status()`` joins Ray itself when the process is not joined, so
        a read that outlived the executor's leave would join again, a connection nobody
        leaves (its threads and descriptors stay) and one the next load's join trips on."""
        roster = self.roster
        for w in roster.handles:
            w.ready = False
            for fut in list(w.tasks):
                fut.cancel()
        roster.notify()
        reading = self._reading
        if reading is not None:  # bounded: a read a lost cluster holds is left behind
            await asyncio.wait([reading], timeout=ROUTER_STOP_S)
        if self._deployed and roster.cluster_up:
            from ray import serve

            loop = asyncio.get_running_loop()
            try:
                await loop.run_in_executor(None, serve.delete, self.app)
            except Exception:  # the cluster is already gone
                pass
            if self.control is not None:
                import ray

                try:
                    ray.kill(self.control, no_restart=True)
                except Exception:  # the cluster is already gone
                    pass
        await self._shutdown_routers()

    async def _shutdown_routers(self) -> None:
        """Stop the handles' routers (Serve runs each on a loop thread of its own, polling
        the controller): left running past the executor's leave, their next call joins
        Ray again on their own, a connection nobody leaves and a join that races the next
        load's (bounded: a router that does not stop in ``ROUTER_STOP_S`` is left)."""
        handles = [w.actor for w in self.roster.handles]
        for handle in [*handles, self.stream_handle]:
            if handle is None:
                continue
            try:
                await asyncio.wait_for(handle.shutdown_async(), ROUTER_STOP_S)
            except Exception as exc:  # a router never started, or already stopped
                log.debug("model %r: a Serve router did not stop: %r", self.app, exc)

    # -- health-checked --------------------------------------------------------------------
    def serving(self) -> bool:
        return self.health.serving

    def probed(self) -> None:
        """Read the deployment's health every ``STATUS_INTERVAL_S``, one read at a time
        (a read blocks on Serve's controller; it runs on a thread)."""
        loop = asyncio.get_running_loop()
        if self._reading is not None or loop.time() < self._next_read:
            return
        self._next_read = loop.time() + STATUS_INTERVAL_S
        reading = self._reading = loop.run_in_executor(
            None, read_health, self.app, self.roster.spec.name
        )
        reading.add_done_callback(self._health_read)

    def _health_read(self, reading: asyncio.Future[DeploymentHealth]) -> None:
        self._reading = None
        if reading.cancelled() or self.roster.closing:
            return
        exc = reading.exception()
        # Serve's controller did not answer: the deployment is not known to serve.
        health = MISSING if exc is not None else reading.result()
        if exc is None:
            self.running = health.running
        if health.serving != self.health.serving:
            log.warning(
                "model %r: the Serve deployment %s (%d of %d replicas running)%s",
                self.roster.spec.name,
                "serves again" if health.serving else "is not serving",
                health.running,
                health.replicas,
                "" if exc is None else f"; reading Serve's status failed: {exc!r}",
            )
        self.health = health
        self.roster.notify()

    def has_capacity(self) -> bool:
        return self.autoscaling.min_replicas == 0 or self.running > 0

    def unavailable(self) -> errors.ZeroserveError | None:
        if self.has_capacity():
            return None
        return contract.restarting(
            f"model {self.roster.spec.name!r} has no worker to take this request: its Serve "
            "deployment has no running replica (Serve is replacing them); retry later"
        )

    # -- scaled ----------------------------------------------------------------------------
    async def acquire(self, priority: Priority, arrived: float) -> RayWorkerHandle:
        return await self.roster.take(self._take_batch, priority, arrived)

    def _take_batch(self) -> RayWorkerHandle | None:
        roster = self.roster
        if roster.closing:
            raise errors.Closed("the engine is shutting down")
        if not roster.cluster_up:
            raise roster.unreachable()
        if roster.handles and self.in_flight < self.capacity:
            self.in_flight += 1
            return roster.handles[0]
        return None

    def release(self, w: RayWorkerHandle) -> None:
        self.in_flight -= 1
        self.roster.notify()

    # -- addressed -------------------------------------------------------------------------
    async def call(
        self, w: RayWorkerHandle, response: Any, deadline_at: float | None = None
    ) -> Any:
        """Await one handle call; cancelling the caller cancels the replica's request.
        ``deadline_at`` is not watched: Serve's own health checks replace a replica (no
        hung-call reclaim here)."""
        fut = asyncio.ensure_future(response)
        w.tasks.add(fut)
        w.outstanding += 1
        try:
            return await self.supervisor.race(fut)
        except asyncio.CancelledError:
            response.cancel()
            raise
        except ClusterUnavailable:
            response.cancel()
            raise
        except errors.ZeroserveError:
            raise
        except Exception as exc:
            raise WorkerError(
                f"Ray Serve call of model {self.roster.spec.name!r} failed: {type(exc).__name__}",
                status=503,
            ) from None
        finally:
            w.outstanding -= 1
            w.tasks.discard(fut)

    async def infer_arrays(
        self,
        w: RayWorkerHandle,
        arrays: list[dict[str, np.ndarray]],
        deadline_at: float | None,
    ) -> list[InferResult]:
        """One ``infer_once`` per batch with descriptors, or the object store when the
        replica did not attach (or none can: ``same_node=never``)."""
        roster = self.roster
        if roster.placement.same_node == "never":  # no replica attached: skip the probe
            return await marshal.infer_detached(self.call, w, arrays, deadline_at)
        leases: list[Lease] = []
        rid = next(roster.ids)
        try:
            descs = [
                {k: marshal.describe_input(roster.arena, v, leases) for k, v in item.items()}
                for item in arrays
            ]
            out = await self.call(w, w.actor.infer_once.remote(rid, msgspec.msgpack.encode(descs)))
            if out is None:  # a replica on another node: through the object store
                return await marshal.infer_detached(self.call, w, arrays, deadline_at)
            raw, extra = out
            reply = a.REPLY.decode(raw)
            if isinstance(reply, a.Failed):
                raise marshal.rebuild(reply)
            assert isinstance(reply, a.Done)
            results = [marshal.result(roster.arena, item, leases) for item in reply.outputs]
            for i, key, arr in extra:
                metrics.count_copy("ray_get", np.asarray(arr).nbytes)
                results[i].outputs[key] = arr
            return results
        finally:
            for lease in leases:
                lease.release()

    def generate(
        self,
        req: GenerateRequest,
        channel: Channel,
        deadline_at: float | None,
        on_start: Callable[[], None] | None,
    ) -> Producer:
        # No deadline: a Serve stream is not watched for hanging (see ``call``).
        return RayProducer(self.roster, self.supervisor, ServeFeed(self), req, channel, on_start)

    def statistics(self) -> WorkerStatistics:
        roster = self.roster
        return WorkerStatistics(
            executor=self.kind,
            workers=self.health.replicas,
            ready=self.health.running if roster.cluster_up else 0,
            busy=self.in_flight,
            streams=len(roster.streams),
            restarts=0,
            crashes=0,
        )
