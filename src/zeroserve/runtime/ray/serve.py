"""The ``ray-serve`` executor: a model served by an autoscaling Ray Serve deployment
(docs/architecture.md, "Executors: ray", "Elastic: ray-serve").

Strategy
--------
The model runs in the replicas of one Serve deployment with an ``autoscaling_config``
(``min_replicas``, ``max_replicas``, ``target_ongoing_requests``): Ray Serve adds and
removes replicas under load. zeroserve stays the HTTP ingress: Serve is started with its
proxy disabled and the application has no route (``route_prefix=None``); every call goes
through the deployment's handle.

A replica is a :class:`ServeReplica`, the ``ray`` executor's actor logic
(:class:`~.actor.RayWorker`: arena attach by ``/proc/<pid>/fd``, descriptors, the
model's threads) with one call per request instead of two, since Serve may route a
follow-up call to another replica:

* ``infer_once(id, descs)`` on a replica that attached our arena (the ingress's node):
  inputs are read from the arena; outputs already in it come back as descriptors, the
  others come back as arrays through Serve's response (one copy, counted ``ray_get``).
* on a replica that did not attach (another node or user, ``same_node=never``) it answers ``None`` and the ingress
  sends the batch again through the object store (``ray_put``, counted) to
  ``infer_arrays``, whose outputs come back counted ``ray_get``: the ``ray`` executor's
  detached path.

Serve's router prefers replicas on the caller's node, so the retry is paid only when
the replica chosen is elsewhere.

Slots: ``max_replicas * max_ongoing_requests`` batches in flight at most (what Serve
would queue beyond).

Health: readiness is the deployment's health as Serve reports it. The cluster watch
(``RayExecutor._watch``) reads ``serve.status()`` every ``STATUS_INTERVAL_S``, on a
thread (it is a blocking call to Serve's controller, and one still running is not
started again): the executor is ready while the deployment is healthy (``HEALTHY``, or
scaling) with a replica running. A replica that dies fails the calls in flight on it
(503; a stream is cut with an error event), Serve notices it at its next health check
(every ``HEALTH_CHECK_PERIOD_S``), marks the deployment ``UNHEALTHY`` and replaces the
replica: ``/ready`` answers 503 meanwhile. The statistics count Serve's replicas
(``workers``) and the running ones (``ready``).

Streams (``generate``) go through the handle as a streaming response
(``handle.options(stream=True)``): the replica runs the ``ray`` actor's generator
(``RayWorker.generate``, the same items) under the same per-stream credit window. A
follow-up call through the handle could land on another replica, so credits and abort
do not go to the replica: they go to this model's :class:`StreamControl`, a small actor
on the ingress's node, and the replica's ``generate_stream`` long-polls it (``take``)
for returned credit, one Ray call per half window, and for an abort. Cancelling the
streaming response (disconnect, deadline) also cancels the replica's generator. A raw
input goes as a descriptor; a replica that did not attach answers ``("x", None)`` first
and the ingress reopens the stream with the bytes (``ray_put``).
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
from collections import OrderedDict
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass, field, replace
from enum import Enum
from typing import TYPE_CHECKING, Any, ClassVar

import msgspec
import numpy as np

from ... import errors, metrics
from ...errors import ClusterUnavailable, ModelLoadError, WorkerError
from ...models.base import GenerateRequest, Model
from ..arena import Arena, Lease
from ..channel import Channel
from ..contract import Producer
from ..results import InferResult, WorkerStatistics
from ..stepping import StreamCredit
from ..tensors import TensorDesc
from . import actor as a
from . import cluster
from .executor import RayExecutor, RayWorkerHandle, _RayProducer, _rebuild

if TYPE_CHECKING:
    from ..options import ResolvedModel, RuntimeOptions

log = logging.getLogger("zeroserve.runtime.ray")

# Spec options of ``executor=ray-serve`` read here (the rest of ``placement`` is the
# replicas' Ray placement, as for ``executor=ray``).
AUTOSCALING_KEYS = frozenset(
    {
        "min_replicas",
        "max_replicas",
        "target_ongoing_requests",
        "upscale_delay_s",
        "downscale_delay_s",
        "look_back_period_s",
        "metrics_interval_s",
        "max_ongoing_requests",
    }
)
# Requests a replica takes at once before Serve queues at the handle (Serve's default).
DEFAULT_MAX_ONGOING_REQUESTS = 5
# Streams a StreamControl remembers as closed, so that a replica's ``take`` arriving
# after the ingress closed the stream answers "stop" instead of waiting forever; far more
# than the streams one model has open at once.
CLOSED_STREAMS_KEPT = 4096
# ``take``'s answer once a stream is aborted or closed.
STOP = -1
# How often the executor reads its deployment's health from Serve (``serve.status()``,
# one call to Serve's controller): ``/ready`` follows Serve within about this.
STATUS_INTERVAL_S = 0.5
# How often Serve health-checks each replica (Serve's default is 10 s): a replica that
# died is noticed, and its replacement started, within about this. One small actor call
# per replica per period.
HEALTH_CHECK_PERIOD_S = 2.0
# The deployment states Serve reports in which it serves (scaling included).
SERVING_STATES = frozenset({"HEALTHY", "UPSCALING", "DOWNSCALING"})
# Replica states that no longer count as one of the deployment's replicas.
GONE_REPLICA_STATES = frozenset({"STOPPING", "STOPPED"})


@dataclass(frozen=True, slots=True)
class DeploymentHealth:
    """A deployment's health as Serve reported it last: whether it serves, and its
    replicas (all that are not stopping) and running ones."""

    serving: bool
    replicas: int
    running: int


def deployment_health(status: str, replica_states: Mapping[str, int]) -> DeploymentHealth:
    """The health of a deployment in ``status`` (Serve's ``DeploymentStatus``) with
    ``replica_states`` (Serve's count of replicas by ``ReplicaState``)."""
    running = sum(n for state, n in replica_states.items() if state == "RUNNING")
    replicas = sum(n for state, n in replica_states.items() if state not in GONE_REPLICA_STATES)
    return DeploymentHealth(status in SERVING_STATES and running > 0, replicas, running)


def _state(value: object) -> str:
    """A Serve status or replica state as its name: Serve's own enums (``str`` ones)
    in some places, their plain values in others (``serve.status()`` in Ray 2.60)."""
    return str(value.value) if isinstance(value, Enum) else str(value)


# What a deployment that Serve does not list counts as (deleted, or not deployed yet).
MISSING = DeploymentHealth(False, 0, 0)


@dataclass(frozen=True, slots=True)
class Autoscaling:
    min_replicas: int = 1
    max_replicas: int = 1
    max_ongoing_requests: int = DEFAULT_MAX_ONGOING_REQUESTS
    config: Mapping[str, float] = field(default_factory=dict)


def parse_autoscaling(options: Mapping[str, Any]) -> Autoscaling:
    """The deployment's autoscaling from the spec options; ``ValueError`` names the
    option at fault."""

    def number(key: str, default: float, *, integer: bool) -> float:
        value = options.get(key, default)
        ok = isinstance(value, int) or (not integer and isinstance(value, float))
        if isinstance(value, bool) or not ok or value < 0:
            kind = "a non-negative integer" if integer else "a non-negative number"
            raise ValueError(f"{key} must be {kind}, not {value!r}")
        return value  # type: ignore[no-any-return]

    lo = int(number("min_replicas", 1, integer=True))
    hi = int(number("max_replicas", max(1, lo), integer=True))
    if hi < max(1, lo):
        raise ValueError(f"max_replicas ({hi}) must be >= max(1, min_replicas={lo})")
    ongoing = int(number("max_ongoing_requests", DEFAULT_MAX_ONGOING_REQUESTS, integer=True))
    if ongoing < 1:
        raise ValueError("max_ongoing_requests must be at least 1")
    config: dict[str, float] = {"min_replicas": lo, "max_replicas": hi}
    for key in (
        "target_ongoing_requests",
        "upscale_delay_s",
        "downscale_delay_s",
        "look_back_period_s",
        "metrics_interval_s",
    ):
        if key in options:
            config[key] = number(key, 0.0, integer=False)
    return Autoscaling(lo, hi, ongoing, config)


class ServeReplica(a.RayWorker):
    """One Serve replica: the ``ray`` actor's logic, one call per request."""

    # Serve sends a replica up to ``max_ongoing_requests`` calls at once; they run at once.
    serial_batches: ClassVar[bool] = False
    links: ClassVar[bool] = False

    def __init__(
        self,
        factory: Callable[..., Model],
        options: Mapping[str, Any],
        name: str,
        arena: a.ArenaRef | None,
    ) -> None:
        super().__init__(factory, options, name, arena)

    async def infer_once(
        self, rid: int, descs: bytes
    ) -> tuple[bytes, list[tuple[int, str, np.ndarray]]] | None:
        """``infer`` on the arena; outputs the ingress would have to allocate come back
        as arrays (item index, name, array). ``None``: not attached, send arrays."""
        if self.view is None:
            return None
        reply = a.REPLY.decode(await self.infer(rid, descs))
        if not isinstance(reply, a.NeedAlloc):
            return msgspec.msgpack.encode(reply), []
        described, pending = self.pending.pop(rid)
        index = {id(d): i for i, d in enumerate(described)}
        arrays = [(index[id(d)], key, arr) for d, key, arr, _ in pending]
        return msgspec.msgpack.encode(a.Done(described, 0)), arrays

    async def generate_stream(
        self,
        rid: int,
        req: bytes,
        raw: TensorDesc | None,
        raw_bytes: bytes | None,
        window: int,
        control: Any,
    ) -> AsyncIterator[tuple[str, Any]]:
        """``RayWorker.generate``'s items, with credit and abort fed from ``control``;
        ``("x", None)`` alone when ``raw`` is a descriptor and this replica did not
        attach the arena (the ingress resends the bytes)."""
        if raw is not None and self.view is None:
            yield ("x", None)
            return
        items = self.generate(rid, req, raw, raw_bytes, window)
        feeder = asyncio.get_running_loop().create_task(self._feed(rid, control))
        try:
            async for item in items:
                yield item
        finally:
            feeder.cancel()
            await items.aclose()

    async def _feed(self, rid: int, control: Any) -> None:
        while True:
            n = await control.take.remote(rid)
            if n == STOP:
                await self.abort(rid)
                return
            await self.credit(rid, n)


class StreamControl:
    """The credit and abort side of one model's Serve streams (a Ray actor on the
    ingress's node): the ingress adds credit and aborts, a replica takes."""

    def __init__(self) -> None:
        self.credits: dict[int, StreamCredit] = {}
        self.stopped: set[int] = set()
        self.closed: OrderedDict[int, None] = OrderedDict()

    def _get(self, rid: int) -> StreamCredit:
        c = self.credits.get(rid)
        if c is None:
            c = self.credits[rid] = StreamCredit(0)
        return c

    async def credit(self, rid: int, n: int) -> None:
        if rid not in self.closed:
            self._get(rid).add(n)

    async def abort(self, rid: int) -> None:
        if rid not in self.closed:
            self.stopped.add(rid)
            self._get(rid).add(1)

    async def close(self, rid: int) -> None:
        self.closed[rid] = None
        while len(self.closed) > CLOSED_STREAMS_KEPT:
            self.closed.popitem(last=False)
        self.stopped.add(rid)
        c = self.credits.pop(rid, None)
        if c is not None:
            c.add(1)  # wake a waiting take, which answers STOP

    async def take(self, rid: int) -> int:
        """Wait for credit returned on stream ``rid`` and take all of it; ``STOP`` once
        the stream was aborted or closed."""
        if rid in self.closed:
            return STOP
        c = self._get(rid)
        await c.take()
        if rid in self.stopped:
            self.stopped.discard(rid)
            self.credits.pop(rid, None)
            return STOP
        n, c.n = 1 + c.n, 0
        return n


# Models of one ingress load concurrently; they start (or connect to) Serve and build
# their deployments one at a time.
_serve_lock = threading.Lock()


def _start_serve() -> None:
    """Start Serve with its proxy disabled, or connect to the running one (blocking)."""
    import ray.exceptions as rex

    from ray import serve

    try:
        serve.start(proxy_location="Disabled")
    except rex.ActorAlreadyExistsError:  # another ingress process started it meanwhile
        serve.start(proxy_location="Disabled")


def app_name(model: str) -> str:
    """The Serve application of a model: unique per ingress process."""
    return f"zeroserve-{os.getpid()}-{model}"


class RayServeExecutor(RayExecutor):
    kind = "ray-serve"
    links: ClassVar[bool] = False  # replicas are reached through Serve's handles

    def __init__(self, spec: ResolvedModel, arena: Arena, options: RuntimeOptions) -> None:
        rest = {k: v for k, v in spec.placement.items() if k not in AUTOSCALING_KEYS}
        try:
            self.autoscaling = parse_autoscaling(spec.placement)
        except ValueError as exc:
            raise ModelLoadError(spec.name, str(exc)) from exc
        super().__init__(replace(spec, placement=rest), arena, options)
        self.app = app_name(spec.name)
        self.capacity = self.autoscaling.max_replicas * self.autoscaling.max_ongoing_requests
        self.in_flight = 0
        self._deployed = False
        self.control: Any = None
        self.stream_handle: Any = None
        # The deployment's health (see the module doc): serve.run returned, so it is
        # running when the executor starts; then as ``serve.status()`` reports it.
        self.health = DeploymentHealth(True, 1, 1)
        self._reading: asyncio.Future[DeploymentHealth] | None = None
        self._next_read = 0.0

    async def start(self, timeout: float) -> None:
        loop = asyncio.get_running_loop()
        try:
            await loop.run_in_executor(None, cluster.connect, self.options.ray_address)
        except Exception as exc:
            raise ModelLoadError(self.spec.name, f"cannot join Ray: {exc}") from exc
        self._connected = True
        try:
            handle = await asyncio.wait_for(loop.run_in_executor(None, self._deploy), timeout)
            pid, *_ = await asyncio.wait_for(handle.hello.remote(), timeout)
        except BaseException as exc:
            await self.aclose()
            if isinstance(exc, TimeoutError):
                raise ModelLoadError(
                    self.spec.name, f"the Serve deployment did not start in {timeout} s"
                ) from exc
            raise ModelLoadError(self.spec.name, f"{type(exc).__name__}: {exc}") from exc
        self.stream_handle = handle.options(stream=True)
        w = RayWorkerHandle(0, handle)
        w.pid, w.attached, w.ready = pid, True, True
        self.workers.append(w)
        self._started = True
        self._start_watch()
        self._notify()

    def _deploy(self) -> Any:
        """Start Serve without its proxy and run this model's application (blocking).
        One model at a time: building a deployment is not thread-safe in Ray 2.60
        (it registers modules with cloudpickle, process-wide)."""
        with _serve_lock:
            return self._deploy_locked()

    def _deploy_locked(self) -> Any:
        from ray import serve

        _start_serve()
        spec, auto = self.spec, self.autoscaling
        actor = self.placement.actor_options()
        deployment = serve.deployment(
            ServeReplica,
            name=spec.name,
            autoscaling_config=dict(auto.config),
            max_ongoing_requests=auto.max_ongoing_requests,
            health_check_period_s=HEALTH_CHECK_PERIOD_S,
            ray_actor_options={
                "num_cpus": actor["num_cpus"],
                "num_gpus": actor["num_gpus"],
                "resources": actor["resources"],
            },
        )
        ref: a.ArenaRef | None = None
        if self.placement.same_node == "auto":
            ref = a.ArenaRef(os.getpid(), self.arena.fd, self.arena.size, self.arena.token)
        app = deployment.bind(  # type: ignore[attr-defined]
            spec.factory, dict(spec.options), spec.name, ref
        )
        self._deployed = True
        self.control = self._start_control()
        return serve.run(app, name=self.app, route_prefix=None)

    def _start_control(self) -> Any:
        """This model's StreamControl actor, pinned to the ingress's node (blocking)."""
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        import ray

        here = NodeAffinitySchedulingStrategy(ray.get_runtime_context().get_node_id(), soft=False)
        return (
            ray.remote(StreamControl)
            .options(  # type: ignore[attr-defined]
                name=f"{self.app}-streams", num_cpus=0, scheduling_strategy=here
            )
            .remote()
        )

    def ready(self) -> bool:
        return self._started and not self._closing and self._cluster_up and self.health.serving

    # -- health ----------------------------------------------------------------------------
    def _probed(self) -> None:
        """Read the deployment's health every ``STATUS_INTERVAL_S``, one read at a time
        (a read blocks on Serve's controller; it runs on a thread)."""
        loop = asyncio.get_running_loop()
        if self._reading is not None or loop.time() < self._next_read:
            return
        self._next_read = loop.time() + STATUS_INTERVAL_S
        reading = self._reading = loop.run_in_executor(None, self._read_health)
        reading.add_done_callback(self._health_read)

    def _read_health(self) -> DeploymentHealth:
        """The deployment's health from ``serve.status()`` (blocking). Under the deploy
        lock: Serve's client is process-wide, and another model's deployment may be
        starting it or building on it from another thread."""
        from ray import serve

        with _serve_lock:
            status = serve.status()
        app = status.applications.get(self.app)
        dep = None if app is None else app.deployments.get(self.spec.name)
        if dep is None:
            return MISSING
        states = {_state(state): n for state, n in dep.replica_states.items()}
        return deployment_health(_state(dep.status), states)

    def _health_read(self, reading: asyncio.Future[DeploymentHealth]) -> None:
        self._reading = None
        if reading.cancelled() or self._closing:
            return
        exc = reading.exception()
        # Serve's controller did not answer: the deployment is not known to serve.
        health = MISSING if exc is not None else reading.result()
        if health.serving != self.health.serving:
            log.warning(
                "model %r: the Serve deployment %s (%d of %d replicas running)%s",
                self.spec.name,
                "serves again" if health.serving else "is not serving",
                health.running,
                health.replicas,
                "" if exc is None else f"; reading Serve's status failed: {exc!r}",
            )
        self.health = health
        self._notify()

    async def aclose(self) -> None:
        if self._closing:
            return
        self._closing = True
        for w in self.workers:
            w.ready = False
            for fut in list(w.tasks):
                fut.cancel()
        self._notify()
        for t in list(self._tasks):
            t.cancel()
        loop = asyncio.get_running_loop()
        if self._deployed and self._cluster_up:  # a lost cluster took the app with it
            from ray import serve

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
        if self._connected:
            self._connected = False
            await loop.run_in_executor(None, cluster.disconnect)

    # -- slots -----------------------------------------------------------------------------
    async def acquire(self) -> RayWorkerHandle:
        while True:
            if self._closing:
                raise errors.Closed("the engine is shutting down")
            if not self._cluster_up:
                raise self._unreachable()
            if self.workers and self.in_flight < self.capacity:
                self.in_flight += 1
                return self.workers[0]
            await self._wait()

    def release(self, slot: Any) -> None:
        self.in_flight -= 1
        self._notify()

    # -- work ------------------------------------------------------------------------------
    async def _await(
        self, w: RayWorkerHandle, response: Any, deadline_at: float | None = None
    ) -> Any:
        """Await one handle call; cancelling the caller cancels the replica's request.
        It overrides the actor call, so the base's object-store path (``_infer_detached``)
        and ``embed`` serve deployments too. ``deadline_at`` is not watched: Serve's own
        health checks replace a replica (no hung-call reclaim here)."""
        fut = asyncio.ensure_future(response)
        w.tasks.add(fut)
        w.outstanding += 1
        try:
            return await self._race(fut)
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
                f"Ray Serve call of model {self.spec.name!r} failed: {type(exc).__name__}",
                status=503,
            ) from None
        finally:
            w.outstanding -= 1
            w.tasks.discard(fut)

    async def _infer_arrays(
        self,
        w: RayWorkerHandle,
        arrays: list[dict[str, np.ndarray]],
        deadline_at: float | None = None,
    ) -> list[InferResult]:
        if self.placement.same_node == "never":  # no replica attached: skip the probe
            return await self._infer_detached(w, arrays, deadline_at)
        leases: list[Lease] = []
        rid = next(self._ids)
        try:
            descs = [{k: self._describe(v, leases) for k, v in item.items()} for item in arrays]
            out = await self._await(
                w, w.actor.infer_once.remote(rid, msgspec.msgpack.encode(descs))
            )
            if out is None:  # a replica on another node: through the object store
                return await self._infer_detached(w, arrays, deadline_at)
            raw, extra = out
            reply = a.REPLY.decode(raw)
            if isinstance(reply, a.Failed):
                raise _rebuild(reply)
            assert isinstance(reply, a.Done)
            results = [self._result(item, leases) for item in reply.outputs]
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
        *,
        deadline_at: float | None = None,
        on_start: Callable[[], None] | None = None,
    ) -> Producer:
        return _ServeProducer(self, req, channel, on_start)

    def statistics(self) -> WorkerStatistics:
        return WorkerStatistics(
            executor=self.kind,
            workers=self.health.replicas,
            ready=self.health.running if self._cluster_up else 0,
            busy=self.in_flight,
            streams=len(self._producers),
            restarts=0,
            crashes=0,
        )


class _ServeProducer(_RayProducer):
    """A stream through the deployment's handle; credit and abort through the
    model's StreamControl (see the module doc)."""

    ex: RayServeExecutor

    def __init__(
        self,
        ex: RayServeExecutor,
        req: GenerateRequest,
        channel: Channel,
        on_start: Callable[[], None] | None = None,
    ) -> None:
        self.response: Any = None
        super().__init__(ex, req, channel, on_start)

    def _control(self) -> Any:
        return self.ex.control

    async def _items(
        self, w: RayWorkerHandle, req: GenerateRequest, leases: list[Lease]
    ) -> AsyncIterator[tuple[str, Any]]:
        ex = self.ex
        encoded = msgspec.msgpack.encode(msgspec.structs.replace(req, raw=None))
        attached = ex.placement.same_node != "never"
        while True:
            raw, raw_bytes = self._raw(w, req, leases, attached)
            self.response = ex.stream_handle.generate_stream.remote(
                self.rid, encoded, raw, raw_bytes, self.window, ex.control
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
                    f"Ray Serve stream of model {ex.spec.name!r} failed: {type(exc).__name__}",
                    status=503,
                ) from None
            attached = False

    def _closed(self) -> None:
        if self.ex.control is not None:
            self.ex.control.close.remote(self.rid)

    def abort(self) -> None:
        if not self.aborted and self.response is not None:
            self.response.cancel()
        super().abort()
