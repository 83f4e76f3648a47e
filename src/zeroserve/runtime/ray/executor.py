"""The Ray executor: a model's workers run on Ray (docs/architecture.md, "Executors: ray",
"Elastic: executor=ray-serve").

Strategy
--------
The same contract as the ``process`` executor, with Ray deciding where each worker runs
and restarting it. One executor class serves both ``executor=ray`` and
``executor=ray-serve``; what differs is its :class:`Fleet`, the strategy that says how
the workers are created, addressed, scaled and health-checked: named actors
(:class:`~.actors.ActorFleet`) or the replicas of an autoscaling Serve deployment
(``serve.ingress.ServeFleet``). Around the fleet, the executor's parts each own one
concern:

* :class:`~.roster.Roster`: the worker handles, routing (``pick``), the lifecycle flags;
* :class:`~.supervision.Supervisor`: faults and restarts, hung work, links, the cluster
  watch;
* :mod:`.marshal`: payloads to and from actors (descriptors on this node, the object
  store otherwise, every copy counted);
* :class:`~.producer.RayProducer`: one stream under per-stream credits.

The executor itself joins Ray, starts and closes the fleet, and runs the work a caller
asks for: a batch or an embedding on a linked worker goes through its link (the worker
protocol, as a process worker's), any other through the fleet's Ray calls.

Invariants
----------
* Everything here runs on the event-loop thread; Ray's blocking calls go to threads.
* While the cluster is unreachable the executor has no capacity and is not ready
  (``ClusterUnavailable`` at admission); work on a link goes on while its actor lives.
* While no worker can take work (every one restarting, or running hung work: the fleet's
  ``has_capacity``) the executor is not ready and admission answers 503 at the head.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from ... import errors
from ...errors import ModelLoadError, WorkerError
from ...models.base import GenerateRequest
from ..arena import Arena
from ..channel import Channel
from ..classes import Priority
from ..contract import Executor, Producer
from ..inproc import validate_inputs
from ..results import InferResult, WorkerStatistics
from ..tensors import as_array
from . import cluster, marshal
from .actors import ActorFleet
from .placement import parse_placement
from .roster import RayWorkerHandle, Roster
from .supervision import Supervisor

if TYPE_CHECKING:
    from ..options import ResolvedModel, RuntimeOptions


class Fleet(Protocol):
    """How a Ray executor's workers are created, addressed, scaled and health-checked."""

    @property
    def kind(self) -> str:
        """The executor's kind, as its statistics name it."""
        ...

    async def start(self, timeout: float) -> None:
        """Create the workers and wait for them to load; ``ModelLoadError`` when they do
        not (the executor then closes)."""
        ...

    async def close(self) -> None:
        """Stop every worker's calls and let go of the workers (the cluster is joined)."""
        ...

    def serving(self) -> bool:
        """Whether the workers serve (the executor's readiness, beside the cluster's)."""
        ...

    def has_capacity(self) -> bool:
        """Whether a worker can take a new request now or soon (the cluster being up):
        false while every one is down (restarting) or running hung work."""
        ...

    def unavailable(self) -> errors.ZeroserveError | None:
        """Why no worker can take a request, while ``has_capacity`` is false and the
        reason is not hung work (workers restarting); None otherwise."""
        ...

    def probed(self) -> None:
        """The cluster answered the supervisor's probe."""
        ...

    async def acquire(self, priority: Priority, arrived: float) -> RayWorkerHandle: ...

    def release(self, w: RayWorkerHandle) -> None: ...

    async def call(self, w: RayWorkerHandle, ref: Any, deadline_at: float | None = None) -> Any:
        """Await one Ray call made on ``w`` (``ref``: what the call returned)."""
        ...

    async def infer_arrays(
        self,
        w: RayWorkerHandle,
        arrays: list[dict[str, np.ndarray]],
        deadline_at: float | None,
    ) -> list[InferResult]:
        """Run the valid part of a batch on ``w`` by Ray calls."""
        ...

    def generate(
        self,
        req: GenerateRequest,
        channel: Channel,
        deadline_at: float | None,
        on_start: Callable[[], None] | None,
    ) -> Producer: ...

    def statistics(self) -> WorkerStatistics: ...


# A fleet made for one executor: given its roster and its supervisor.
FleetFactory = Callable[[Roster, Supervisor], Fleet]


class RayExecutor(Executor):
    def __init__(
        self,
        spec: ResolvedModel,
        arena: Arena,
        options: RuntimeOptions,
        fleet: FleetFactory = ActorFleet,
    ) -> None:
        super().__init__(spec, arena)
        self.options = options
        try:
            placement = parse_placement(spec.placement)
        except ValueError as exc:
            raise ModelLoadError(spec.name, str(exc)) from exc
        self.roster = Roster(spec, arena, options, placement)
        self.supervisor = Supervisor(self.roster)
        self.fleet = fleet(self.roster, self.supervisor)
        self.kind = self.fleet.kind
        self._connected = False
        self._started = False

    # -- lifecycle -----------------------------------------------------------------------
    async def start(self, timeout: float) -> None:
        loop = asyncio.get_running_loop()
        try:
            await loop.run_in_executor(None, cluster.connect, self.options.ray_address)
        except Exception as exc:
            raise ModelLoadError(self.spec.name, f"cannot join Ray: {exc}") from exc
        self._connected = True
        try:
            await self.fleet.start(timeout)
        except ModelLoadError:
            await self.aclose()
            raise
        self._started = True
        self.supervisor.start_watch(self.fleet.probed)
        self.roster.notify()

    def has_capacity(self) -> bool:
        return self.roster.cluster_up and self.fleet.has_capacity()

    def local_pids(self) -> list[int]:
        """The actors (or the Serve replica that answered the load) on this server's Ray
        node; those on other nodes are not measured (runtime/model_memory.py)."""
        here = cluster.local_node()
        return [w.pid for w in self.roster.handles if w.pid and here and w.node == here]

    def unavailable(self) -> errors.ZeroserveError | None:
        if not self.roster.cluster_up:
            return self.roster.unreachable()
        return self.fleet.unavailable()

    def ready(self) -> bool:
        roster = self.roster
        return (
            self._started
            and not roster.closing
            and roster.cluster_up
            and self.fleet.serving()
            and self.fleet.has_capacity()
        )

    async def aclose(self) -> None:
        roster = self.roster
        if roster.closing:
            return
        roster.closing = True
        self.supervisor.stop()
        await self.fleet.close()
        roster.notify()
        if self._connected:
            self._connected = False
            await asyncio.get_running_loop().run_in_executor(None, cluster.disconnect)

    # -- slots -----------------------------------------------------------------------------
    async def acquire(self, priority: Priority, arrived: float) -> RayWorkerHandle:
        return await self.fleet.acquire(priority, arrived)

    def release(self, slot: Any) -> None:
        w: RayWorkerHandle = slot
        self.fleet.release(w)

    # -- work ------------------------------------------------------------------------------
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
        outs = await self.fleet.infer_arrays(w, arrays, deadline_at)
        for i, out in zip(index, outs, strict=True):
            results[i] = out
        return results

    async def embed(
        self, slot: Any, texts: list[str], *, deadline_at: float | None = None
    ) -> np.ndarray:
        w: RayWorkerHandle = slot
        if w.link is not None:
            return await w.link.embed(texts, deadline_at)
        return marshal.embedding(await self.fleet.call(w, w.actor.embed.remote(texts), deadline_at))

    def generate(
        self,
        req: GenerateRequest,
        channel: Channel,
        *,
        deadline_at: float | None = None,
        on_start: Callable[[], None] | None = None,
    ) -> Producer:
        return self.fleet.generate(req, channel, deadline_at, on_start)

    def statistics(self) -> WorkerStatistics:
        return self.fleet.statistics()
