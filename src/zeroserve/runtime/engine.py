"""The ``Engine``: the runtime's one public entry point (docs/architecture.md, app ↔ runtime).

Strategy
--------
Per model: an :class:`~.admission.Admission` (queue depth, 429), a
:class:`~.batcher.Batcher` per batchable capability (``infer``, ``embed``) and an
executor (``inline``, ``thread`` or ``process``). Generations are not batched: each gets
its own bounded :class:`~.channel.Channel` and a producer on the executor.

Every operation takes an admitted :class:`~.admission.Ticket` and releases it when the
operation ends (result, error, cancellation, or stream end/close). Every operation has an
absolute deadline on the injected clock covering queueing and execution; a timer on that
clock fails the request with ``DeadlineExceeded`` (504) wherever it is: queued requests
are removed, batched ones are left out, running generations are aborted.

Cancellation follows asyncio: cancelling the task that awaits ``infer``/``embed`` cancels
the request's future, which the batcher sees (removed if queued, dropped if batched, the
batch cancelled if it was the last live request in it). For streams, ``aclose()`` (or
cancelling the task awaiting the next piece) aborts the producer and, for process
models, tells the worker to stop.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import partial

from .. import metrics
from ..errors import ModelLoadError, ModelNotFound
from ..models.base import Model
from .admission import DEFAULT_RETRY_AFTER_S, check_bytes
from .arena import Arena, ArenaStatistics
from .clock import Clock
from .contract import Executor
from .handle import ModelHandle, ModelRuntime, ModelStatistics, ModelStatus
from .inproc import InlineExecutor, ThreadExecutor
from .model_calls import make_model
from .options import EXECUTORS, ModelConfig, ResolvedModel, RuntimeOptions
from .priority import MAX_NICE
from .process import ProcessExecutor


@dataclass(frozen=True, slots=True)
class ChannelTotals:
    """All open stream channels together."""

    open: int
    pending: int
    pending_bytes: int
    peak_pending_bytes: int
    coalesced: int


@dataclass(frozen=True, slots=True)
class EngineStatus:
    """Why the engine is (not) ready: its lifecycle and every model's state."""

    started: bool
    closed: bool
    models: dict[str, ModelStatus]


@dataclass(frozen=True, slots=True)
class EngineStatistics:
    models: dict[str, ModelStatistics]
    arena: ArenaStatistics
    channels: ChannelTotals
    ready: bool


def _pick(value: int | None, default: int) -> int:
    return int(value if value is not None else default)


class Engine:
    """Loads models, admits requests, batches and runs them, and streams their output."""

    def __init__(
        self,
        configs: Mapping[str, ModelConfig],
        *,
        arena: Arena | None = None,
        clock: Clock = time.monotonic,
        options: RuntimeOptions | None = None,
    ) -> None:
        for key, cfg in configs.items():
            if cfg.name and cfg.name != key:
                raise ValueError(f"model config {cfg.name!r} registered under the name {key!r}")
        self.configs = dict(configs)
        self._owns_arena = arena is None
        self.arena = arena if arena is not None else Arena()
        self.clock = clock
        self.options = options or RuntimeOptions()
        self._models: dict[str, ModelRuntime] = {}
        # One handle per model, made once: a handle holds no per-request state, and the
        # raw endpoint resolves one at every request head.
        self._handles: dict[str, ModelHandle] = {}
        # Versions replaced by ``switch`` that still finish what they admitted.
        self._retiring: set[ModelRuntime] = set()
        self._started = False
        self._closed = False
        # Hears the name of each model whose last request or stream just ended (the
        # model manager: a load waiting for room looks again).
        self.idle_listener: Callable[[str], None] | None = None

    # -- lifecycle -----------------------------------------------------------------------
    async def start(self) -> None:
        """Load every model (in parallel). Raises ``ModelLoadError`` naming the first
        model that failed, after stopping the others; never waits longer than
        ``options.load_timeout_s`` per model."""
        runtimes: list[ModelRuntime] = []
        for name, cfg in self.configs.items():
            spec, meta = self._resolve(name, cfg)
            runtimes.append(
                ModelRuntime(
                    spec,
                    meta,
                    self._executor(spec, meta),
                    clock=self.clock,
                    options=self.options,
                )
            )
        timeout = self.options.load_timeout_s
        results = await asyncio.gather(
            *(rt.executor.start(timeout) for rt in runtimes), return_exceptions=True
        )
        failure: BaseException | None = None
        for res in results:
            if isinstance(res, BaseException) and failure is None:
                failure = res
        if failure is not None:
            for rt in runtimes:
                await rt.executor.aclose()
            if isinstance(failure, ModelLoadError):
                raise failure
            raise ModelLoadError("?", repr(failure)) from failure
        for rt in runtimes:
            rt.start_slots()
            rt.start_batchers()
            rt.admission.on_idle = partial(self._went_idle, rt.spec.name)
            self._models[rt.spec.name] = rt
            self._handles[rt.spec.name] = ModelHandle(rt)
        self._started = True
        self._register_metrics()

    async def load(self, name: str, cfg: ModelConfig) -> None:
        """Load one more model while the engine serves the others (docs/architecture.md, "Models at run time").

        Raises ``ModelLoadError`` naming the model when it cannot load; its workers are
        stopped first, so a failed load leaves nothing behind. ``ValueError`` when a model
        of that name is loaded already (``load_beside`` and ``switch`` replace one).
        """
        if not self._started or self._closed:
            raise RuntimeError("the engine is not serving: start it before loading models")
        if name in self._models:
            raise ValueError(f"model {name!r} is loaded already")
        if cfg.name and cfg.name != name:
            raise ValueError(f"model config {cfg.name!r} loaded under the name {name!r}")
        rt = await self._start_runtime(name, cfg)
        self.configs[name] = cfg
        self._models[name] = rt
        self._handles[name] = ModelHandle(rt)

    async def load_beside(self, name: str, cfg: ModelConfig) -> ModelRuntime:
        """Start a new version of loaded model ``name`` beside the one serving, without
        serving it yet (``switch`` does; docs/architecture.md, "Models at run time").

        Raises ``ModelLoadError`` when it cannot load (its workers stopped, the serving
        version untouched); ``ModelNotFound`` when ``name`` is not loaded.
        """
        if self._closed:
            raise RuntimeError("the engine is closed")
        if name not in self._handles:
            raise ModelNotFound(f"model {name!r} is not loaded")
        if cfg.name and cfg.name != name:
            raise ValueError(f"model config {cfg.name!r} loaded under the name {name!r}")
        return await self._start_runtime(name, cfg)

    def switch(self, name: str, rt: ModelRuntime, cfg: ModelConfig) -> ModelRuntime:
        """Serve ``rt`` (from ``load_beside``) as ``name`` from now on, in one step with no
        await: a request that finds ``name`` after this gets ``rt``. Returns the version
        it replaced, still running what it admitted: ``retire`` it."""
        old = self._models[name]
        self._retiring.discard(rt)  # a switch back to a version that was retiring
        self._models[name] = rt
        self._handles[name] = ModelHandle(rt)
        self.configs[name] = cfg
        self._retiring.add(old)
        return old

    async def retire(self, rt: ModelRuntime) -> None:
        """Stop a version ``switch`` replaced (or one ``load_beside`` started and nobody
        served) once the requests and streams it admitted have ended (their own
        deadlines bound them); its workers then stop."""
        rt.admission.close(f"model {rt.spec.name!r} was replaced by a new version")
        try:
            await rt.admission.wait_idle()
        finally:
            self._retiring.discard(rt)
            await rt.aclose()

    async def _start_runtime(self, name: str, cfg: ModelConfig) -> ModelRuntime:
        spec, meta = self._resolve(name, cfg)
        rt = ModelRuntime(
            spec, meta, self._executor(spec, meta), clock=self.clock, options=self.options
        )
        try:
            await rt.executor.start(self.options.load_timeout_s)
        except Exception as exc:
            await rt.executor.aclose()
            if isinstance(exc, ModelLoadError):
                raise
            raise ModelLoadError(name, f"{type(exc).__name__}: {exc}") from exc
        except BaseException:
            await rt.executor.aclose()
            raise
        rt.start_slots()
        rt.start_batchers()
        rt.admission.on_idle = partial(self._went_idle, name)
        return rt

    async def unload(self, name: str) -> None:
        """Stop serving ``name``: new requests no longer find it, the requests and
        streams it admitted run to their end, then its workers stop (nothing in flight
        is cut; a request's own deadline still bounds it). ``ModelNotFound`` when it is
        not loaded."""
        rt = self._models.get(name)
        if rt is None or name not in self._handles:
            raise ModelNotFound(f"model {name!r} is not loaded")
        del self._handles[name]
        rt.admission.close(f"model {name!r} is being unloaded")
        await rt.admission.wait_idle()
        del self._models[name]
        self.configs.pop(name, None)
        await rt.aclose()

    async def aclose(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._unregister_metrics()
        for rt in [*self._models.values(), *self._retiring]:
            await rt.aclose()
        if self._owns_arena:
            self.arena.close()

    async def __aenter__(self) -> Engine:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    def _resolve(self, name: str, cfg: ModelConfig) -> tuple[ResolvedModel, Model]:
        try:
            meta = make_model(cfg.factory, cfg.options)
        except Exception as exc:
            raise ModelLoadError(name, f"{type(exc).__name__}: {exc}") from exc
        if cfg.deadline_s is not None and not 0 < cfg.deadline_s < float("inf"):
            raise ModelLoadError(name, f"deadline_s must be > 0 seconds, not {cfg.deadline_s!r}")
        nice = cfg.nice if cfg.nice is not None else self.options.model_nice
        if type(nice) is not int or not 0 <= nice <= MAX_NICE:
            raise ModelLoadError(name, f"nice must be an integer 0 to {MAX_NICE}, not {nice!r}")
        executor = cfg.executor or meta.executor
        if executor not in EXECUTORS:
            raise ModelLoadError(name, f"unknown executor {executor!r}; expected {EXECUTORS}")
        if cfg.placement and executor not in ("ray", "ray-serve"):
            raise ModelLoadError(
                name,
                f"Ray placement options ({', '.join(cfg.placement)}) need executor=ray "
                "or executor=ray-serve",
            )
        spec = ResolvedModel(
            name=name,
            factory=cfg.factory,
            options=dict(cfg.options),
            executor=executor,
            max_batch_size=_pick(cfg.max_batch_size, meta.max_batch_size),
            max_batch_delay_ms=float(
                cfg.max_batch_delay_ms
                if cfg.max_batch_delay_ms is not None
                else meta.max_batch_delay_ms
            ),
            workers=_pick(cfg.workers, meta.workers),
            queue_depth=_pick(cfg.queue_depth, self.options.queue_depth),
            capabilities=type(meta).capabilities(),
            placement=dict(cfg.placement),
            deadline_s=float(
                cfg.deadline_s if cfg.deadline_s is not None else self.options.default_deadline_s
            ),
            nice=nice,
        )
        return spec, meta

    def _executor(self, spec: ResolvedModel, meta: Model) -> Executor:
        opts = self.options
        if spec.executor == "inline":
            return InlineExecutor(
                spec,
                self.arena,
                model=meta,
                yield_every=opts.inline_yield_every,
                aging_s=opts.priority_aging_s,
            )
        if spec.executor == "thread":
            return ThreadExecutor(
                spec,
                self.arena,
                model=meta,
                yield_every=opts.inline_yield_every,
                hang_grace_s=opts.hang_grace_s,
                aging_s=opts.priority_aging_s,
            )
        if spec.executor == "ray":
            from .ray import RayExecutor  # Ray is an optional extra: imported only when used

            return RayExecutor(spec, self.arena, opts)
        if spec.executor == "ray-serve":
            from .ray.serve.ingress import serve_executor  # needs the [ray] extra's Serve

            return serve_executor(spec, self.arena, opts)
        return ProcessExecutor(spec, self.arena, opts)

    # -- queries -------------------------------------------------------------------------
    def ready(self) -> bool:
        """Every model loaded and every worker up."""
        return (
            self._started and not self._closed and all(rt.ready() for rt in self._models.values())
        )

    def status(self) -> EngineStatus:
        """The lifecycle and every model's workers (what ``/ready`` reports when false)."""
        models = {name: rt.status() for name, rt in self._models.items()}
        return EngineStatus(started=self._started, closed=self._closed, models=models)

    def idle_since(self, name: str) -> float | None:
        """When loaded model ``name`` last had nothing in flight and no stream open (on
        the engine's clock); None while it has."""
        return self._models[name].admission.idle_since

    def fault(self, name: str) -> str | None:
        """Why loaded model ``name`` cannot serve now though it takes requests (its
        engine's child process died; ``ModelRuntime.fault``); None while it can, or
        when it is not loaded."""
        rt = self._models.get(name)
        return rt.fault() if rt is not None else None

    def worker_pids(self, name: str) -> list[int]:
        """The processes on this machine that hold loaded model ``name``: ``process``
        workers, Ray actors on this server's node, an in-process model's own children."""
        return self._models[name].executor.local_pids()

    def _went_idle(self, name: str) -> None:
        if self.idle_listener is not None:
            self.idle_listener(name)

    def names(self) -> list[str]:
        return list(self._models)

    def model(self, name: str) -> ModelHandle:
        handle = self._handles.get(name)
        if handle is None:
            # The name is the client's input: not repeated back (GET /v1/models lists them).
            raise ModelNotFound("the requested model is not served")
        return handle

    def deadline(self, deadline: float | None) -> float:
        """The absolute deadline of a request (the default one if ``None``)."""
        if deadline is None:
            return self.clock() + self.options.default_deadline_s
        return deadline

    def check_bytes(self, nbytes: int) -> None:
        """At a request head: raise ``Overloaded(503)`` if a body of ``nbytes`` would not
        fit the arena's budget of bytes in flight now."""
        check_bytes(self.arena, nbytes, retry_after=self._retry_after())

    def _retry_after(self) -> float:
        backlog = sum(rt.admission.in_flight for rt in self._models.values())
        rate = sum(rt.admission.meter.rate() for rt in self._models.values())
        return DEFAULT_RETRY_AFTER_S if rate <= 0 else max(backlog, 1) / rate

    # -- statistics ----------------------------------------------------------------------
    def _channel_totals(self) -> ChannelTotals:
        stats = [s.statistics() for rt in self._models.values() for s in rt.streams]
        return ChannelTotals(
            open=len(stats),
            pending=sum(s.pending for s in stats),
            pending_bytes=sum(s.pending_bytes for s in stats),
            peak_pending_bytes=max((s.peak_pending_bytes for s in stats), default=0),
            coalesced=sum(s.coalesced for s in stats),
        )

    def statistics(self) -> EngineStatistics:
        return EngineStatistics(
            models={name: rt.statistics() for name, rt in self._models.items()},
            arena=self.arena.statistics(),
            channels=self._channel_totals(),
            ready=self.ready(),
        )

    _SOURCES = ("queue", "batch", "workers", "arena", "channels", "engine", "class_wait")

    def _register_metrics(self) -> None:
        models = self._models
        metrics.register_source(
            "queue",
            lambda: {n: rt.admission.statistics() for n, rt in models.items()},
            counters=("admitted", "rejected", "completed"),
            names={"drain_rate": "drain_rate_per_second"},
        )
        metrics.register_source(
            "batch",
            lambda: {
                n: (rt.infer_batcher or rt.embed_batcher).statistics()  # type: ignore[union-attr]
                for n, rt in models.items()
                if rt.infer_batcher or rt.embed_batcher
            },
            counters=("batches", "batched_requests", "expired", "dropped"),
        )
        metrics.register_source(
            "workers",
            lambda: {n: rt.worker_statistics() for n, rt in models.items()},
            counters=("restarts", "crashes", "reclaimed"),
        )
        metrics.register_source(
            "arena",
            self.arena.statistics,
            counters=("allocations",),
            names={"budget": "budget_bytes", "used": "used_bytes", "peak": "peak_bytes"},
        )
        # Channel totals sum the open channels only (they fall as streams end): gauges.
        metrics.register_source("channels", self._channel_totals)
        # The slots of in-process engines (llama.cpp): zeroserve_engine_<field>{name=model}.
        metrics.register_source(
            "engine",
            lambda: {n: rt.slots.statistics() for n, rt in models.items() if rt.slots is not None},
            counters=("embedded_inputs",),
        )
        # Waits for capacity per priority class (runtime/classes.py):
        # zeroserve_class_wait_<field>{name=model, class=N}, every class that has waited.
        metrics.register_source(
            "class_wait",
            lambda: {n: rt.class_statistics() for n, rt in models.items()},
            counters=("started", "waited_s"),
            label=("name", "class"),
            names={"longest_wait_s": "longest_seconds", "waited_s": "seconds"},
        )

    def _unregister_metrics(self) -> None:
        for name in self._SOURCES:
            metrics.unregister_source(name)
