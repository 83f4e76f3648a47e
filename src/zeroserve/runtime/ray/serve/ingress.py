"""The ingress side of ``executor=ray-serve``: the executor in the server, for a model
served by an autoscaling Ray Serve deployment (docs/architecture.md, "Executors: ray",
"Elastic: ray-serve"). What runs in Ray is :mod:`.replica`; the deployment as Serve sees
it (options, building, health) is :mod:`.deployment`.

Strategy
--------
zeroserve stays the HTTP ingress: every call goes through the deployment's handle. A
batch is one ``infer_once`` call with descriptors; a replica that did not attach
(another node or user, ``same_node=never``) answers ``None`` and the ingress sends the
batch again through the object store (``ray_put``, counted) to ``infer_arrays``, whose
outputs come back counted ``ray_get``: the ``ray`` executor's detached path. Serve's
router prefers replicas on the caller's node, so the retry is paid only when the
replica chosen is elsewhere.

Slots: ``max_replicas * max_ongoing_requests`` batches in flight at most (what Serve
would queue beyond).

Health: readiness is the deployment's health as Serve reports it. The cluster watch
(``RayExecutor._watch``) reads ``serve.status()`` every ``STATUS_INTERVAL_S``, on a
thread (it is a blocking call to Serve's controller, and one still running is not
started again): the executor is ready while the deployment is healthy (``HEALTHY``, or
scaling) with a replica running. A replica that dies fails the calls in flight on it
(503; a stream is cut with an error event), Serve notices it at its next health check,
marks the deployment ``UNHEALTHY`` and replaces the replica: ``/ready`` answers 503
meanwhile. The statistics count Serve's replicas (``workers``) and the running ones
(``ready``).

Streams (``generate``) go through the handle as a streaming response
(``handle.options(stream=True)``), credit and abort through the model's
``StreamControl``. Cancelling the streaming response (disconnect, deadline) also
cancels the replica's generator. A raw input goes as a descriptor; a replica that did
not attach answers ``("x", None)`` first and the ingress reopens the stream with the
bytes (``ray_put``).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable
from dataclasses import replace
from typing import TYPE_CHECKING, Any, ClassVar

import msgspec
import numpy as np

from .... import errors, metrics
from ....errors import ClusterUnavailable, ModelLoadError, WorkerError
from ....models.base import GenerateRequest
from ...arena import Arena, Lease
from ...channel import Channel
from ...contract import Producer
from ...results import InferResult, WorkerStatistics
from .. import actor as a
from .. import cluster
from ..executor import RayExecutor, RayWorkerHandle, _RayProducer, _rebuild
from .deployment import (
    AUTOSCALING_KEYS,
    MISSING,
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
    from ...options import ResolvedModel, RuntimeOptions

log = logging.getLogger("zeroserve.runtime.ray")

# How often the executor reads its deployment's health from Serve (``serve.status()``,
# one call to Serve's controller): ``/ready`` follows Serve within about this.
STATUS_INTERVAL_S = 0.5


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
        from ray import serve

        with serve_lock:
            start_serve()
            app = build_app(self.spec, self.placement, self.autoscaling, self.arena)
            self._deployed = True
            self.control = start_control(self.app)
            return serve.run(app, name=self.app, route_prefix=None)

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
        reading = self._reading = loop.run_in_executor(None, read_health, self.app, self.spec.name)
        reading.add_done_callback(self._health_read)

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
