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
would queue beyond); the deployment is one "worker" in the statistics.

Not served here: streams (``generate``), since credits and abort need the same replica
for the stream's life; a stream request gets a 400 naming the executor.
"""

from __future__ import annotations

import asyncio
import os
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

import msgspec
import numpy as np

from ... import errors, metrics
from ...errors import CapabilityError, ClusterUnavailable, ModelLoadError, WorkerError
from ...models.base import GenerateRequest, Model
from .._common import InferResult, Producer, WorkerStatistics
from ..arena import Arena, Lease
from ..channel import Channel
from . import actor as a
from . import cluster
from .executor import RayExecutor, RayWorkerHandle, _rebuild

if TYPE_CHECKING:
    from ..options import ResolvedModel, RuntimeOptions

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

    async def start(self, timeout: float) -> None:
        loop = asyncio.get_running_loop()
        try:
            await loop.run_in_executor(None, cluster.connect, self.options.ray_address)
        except Exception as exc:
            raise ModelLoadError(self.spec.name, f"cannot join Ray: {exc}") from exc
        self._connected = True
        try:
            handle = await asyncio.wait_for(loop.run_in_executor(None, self._deploy), timeout)
            pid, _ = await asyncio.wait_for(handle.hello.remote(), timeout)
        except BaseException as exc:
            await self.aclose()
            if isinstance(exc, TimeoutError):
                raise ModelLoadError(
                    self.spec.name, f"the Serve deployment did not start in {timeout} s"
                ) from exc
            raise ModelLoadError(self.spec.name, f"{type(exc).__name__}: {exc}") from exc
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
        return serve.run(app, name=self.app, route_prefix=None)

    def ready(self) -> bool:
        return self._started and not self._closing and self._cluster_up

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
    async def _await(self, w: RayWorkerHandle, response: Any) -> Any:
        """Await one handle call; cancelling the caller cancels the replica's request.
        It overrides the actor call, so the base's object-store path (``_infer_detached``)
        and ``embed`` serve deployments too."""
        w.outstanding += 1
        try:
            return await self._race(asyncio.ensure_future(response))
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

    async def _infer_arrays(
        self, w: RayWorkerHandle, arrays: list[dict[str, np.ndarray]]
    ) -> list[InferResult]:
        if self.placement.same_node == "never":  # no replica attached: skip the probe
            return await self._infer_detached(w, arrays)
        leases: list[Lease] = []
        rid = next(self._ids)
        try:
            descs = [{k: self._describe(v, leases) for k, v in item.items()} for item in arrays]
            out = await self._await(
                w, w.actor.infer_once.remote(rid, msgspec.msgpack.encode(descs))
            )
            if out is None:  # a replica on another node: through the object store
                return await self._infer_detached(w, arrays)
            raw, extra = out
            reply = a.REPLY.decode(raw)
            if isinstance(reply, a.Fail):
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
        channel.close(
            CapabilityError(f"model {self.spec.name!r} runs on executor=ray-serve: no streams")
        )
        return _NoStream()

    def statistics(self) -> WorkerStatistics:
        return WorkerStatistics(
            executor=self.kind,
            workers=1,
            ready=1 if self.ready() else 0,
            busy=self.in_flight,
            streams=0,
            restarts=0,
            crashes=0,
        )


class _NoStream(Producer):
    def abort(self) -> None:
        pass
