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
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .. import metrics
from ..errors import CapabilityError, DeadlineExceeded, ModelNotFound, RequestError
from ..models.base import ExecutorKind, GenerateRequest, Model
from ._common import (
    Executor,
    InferResult,
    ModelLoadError,
    ModelSpec,
    Producer,
    WorkerStatistics,
    make_model,
)
from .admission import (
    DEFAULT_QUEUE_DEPTH,
    DEFAULT_RETRY_AFTER_S,
    Admission,
    AdmissionStatistics,
    Ticket,
    check_bytes,
)
from .arena import Arena, ArenaStatistics
from .batcher import Batcher, BatcherStatistics, Pending
from .channel import (
    DEFAULT_CAPACITY,
    DEFAULT_COALESCE_CAP_BYTES,
    Channel,
    ChannelStatistics,
    Policy,
)
from .clock import Clock, Timer, call_at
from .inproc import DEFAULT_YIELD_EVERY, InlineExecutor, ThreadExecutor

# A request's whole life (queueing + execution) when the caller gives no deadline. Five
# minutes covers a long generation on a small CPU model; anything longer is stuck.
DEFAULT_DEADLINE_S = 300.0
# How long start() waits for a model's load() (per model, workers load in parallel).
# Loading real weights from disk takes seconds; two minutes means "it is hung".
DEFAULT_LOAD_TIMEOUT_S = 120.0
# How long aclose() lets process workers exit on their own before they are killed.
DEFAULT_SHUTDOWN_TIMEOUT_S = 5.0
# Restart back-off for a crashed worker: first retry at once (crashes are usually one
# bad request), then doubling up to 5 s so a crash-looping model does not spin a core.
DEFAULT_RESTART_BACKOFF_S = 0.05
MAX_RESTART_BACKOFF_S = 5.0

_EXECUTORS: tuple[ExecutorKind, ...] = ("inline", "thread", "process")


@dataclass(frozen=True, slots=True)
class RuntimeOptions:
    """Runtime-wide defaults. Each is overridable; see the constants for the reasons."""

    default_deadline_s: float = DEFAULT_DEADLINE_S
    channel_capacity: int = DEFAULT_CAPACITY
    coalesce_cap_bytes: int = DEFAULT_COALESCE_CAP_BYTES
    queue_depth: int = DEFAULT_QUEUE_DEPTH
    load_timeout_s: float = DEFAULT_LOAD_TIMEOUT_S
    shutdown_timeout_s: float = DEFAULT_SHUTDOWN_TIMEOUT_S
    restart_backoff_s: float = DEFAULT_RESTART_BACKOFF_S
    max_restart_backoff_s: float = MAX_RESTART_BACKOFF_S
    inline_yield_every: int = DEFAULT_YIELD_EVERY


@dataclass(frozen=True, slots=True)
class ModelConfig:
    """One served model. ``None`` fields fall back to the model class's attributes
    (``executor``, ``max_batch_size``, ``max_batch_delay_ms``, ``workers``) or to
    ``RuntimeOptions.queue_depth``.

    ``factory`` is a ``Model`` subclass (called with ``options`` as keyword arguments)
    or a callable returning a ``Model``. For the ``process`` executor it must be
    importable by name (a module-level class or function), since workers are spawned.
    """

    name: str
    factory: Callable[..., Model]
    options: Mapping[str, Any] = field(default_factory=dict)
    executor: ExecutorKind | None = None
    max_batch_size: int | None = None
    max_batch_delay_ms: float | None = None
    workers: int | None = None
    queue_depth: int | None = None


@dataclass(frozen=True, slots=True)
class ModelStatistics:
    queue: AdmissionStatistics
    infer_batches: BatcherStatistics | None
    embed_batches: BatcherStatistics | None
    workers: WorkerStatistics


@dataclass(frozen=True, slots=True)
class ChannelTotals:
    """All open stream channels together."""

    open: int
    pending: int
    pending_bytes: int
    peak_pending_bytes: int
    coalesced: int


@dataclass(frozen=True, slots=True)
class ModelStatus:
    """One model's readiness, as ``/ready`` reports it."""

    ready: bool
    executor: str
    workers: int
    ready_workers: int


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


class Stream:
    """An async iterator of a generation's pieces (``str``, or bytes-like for raw).

    Iterate it; ``aclose()`` stops the generation early. Errors (the model's, a deadline,
    a worker crash) are raised from the iteration after the pieces before them.
    """

    def __init__(self, runtime: _ModelRuntime, channel: Channel, ticket: Ticket) -> None:
        self._runtime = runtime
        self.channel = channel
        self._ticket = ticket
        self._producer: Producer | None = None
        self._timer: Timer | None = None
        self._finished = False

    def __aiter__(self) -> Stream:
        return self

    async def __anext__(self) -> Any:
        try:
            return await self.channel.__anext__()
        except StopAsyncIteration:
            self._finish()
            raise
        except asyncio.CancelledError:
            self._abort()
            raise
        except BaseException:
            self._finish()
            raise

    async def aclose(self) -> None:
        """Stop the generation (the model's generator is closed; a worker is told)."""
        self._abort()

    def receive_batch_nowait(self, max_items: int) -> list[Any]:
        """Up to ``max_items`` pieces available right now, without waiting: what a writer
        sends in one go. The end of the stream or an error is left for ``__anext__``."""
        return self.channel.receive_batch_nowait(max_items)

    def statistics(self) -> ChannelStatistics:
        return self.channel.statistics()

    @property
    def finish_reason(self) -> str | None:
        """What the model's generator returned (``"stop"`` / ``"length"`` for models that
        say), once the stream has ended; ``None`` if it returned nothing."""
        result = self.channel.result
        return result if isinstance(result, str) else None

    def _expire(self) -> None:
        self.channel.abort(DeadlineExceeded("the request's deadline passed during generation"))
        if self._producer is not None:
            self._producer.abort()

    def _abort(self) -> None:
        if self._finished:
            return
        if self._producer is not None:
            self._producer.abort()
        self.channel.close_receiver()
        self._finish()

    def _finish(self) -> None:
        if self._finished:
            return
        self._finished = True
        if self._timer is not None:
            self._timer.cancel()
        self._ticket.release()
        self._runtime.streams.discard(self)


class _ModelRuntime:
    def __init__(self, engine: Engine, spec: ModelSpec, meta: Model, executor: Executor) -> None:
        self.engine = engine
        self.spec = spec
        self.meta = meta
        self.executor = executor
        self.admission = Admission(spec.name, spec.queue_depth, engine.clock)
        self.streams: set[Stream] = set()
        self.infer_batcher: Batcher[Any] | None = None
        self.embed_batcher: Batcher[Any] | None = None

    def start_batchers(self) -> None:
        caps = self.spec.capabilities
        if "infer" in caps:
            self.infer_batcher = self._start_batcher("infer", self._run_infer)
        if "embed" in caps:
            self.embed_batcher = self._start_batcher("embed", self._run_embed)

    def _start_batcher(self, kind: str, run: Any) -> Batcher[Any]:
        spec, ex = self.spec, self.executor
        batcher: Batcher[Any] = Batcher(
            max_batch_size=spec.max_batch_size,
            max_delay_s=spec.max_batch_delay_ms / 1000.0,
            clock=self.engine.clock,
            acquire=ex.acquire,
            release=ex.release,
            run=run,
            name=f"{spec.name}-{kind}",
        )
        batcher.start()
        return batcher

    async def aclose(self) -> None:
        for b in (self.infer_batcher, self.embed_batcher):
            if b is not None:
                await b.aclose()
        for s in list(self.streams):
            s._abort()
        await self.executor.aclose()

    async def _run_infer(self, slot: Any, batch: list[Pending]) -> None:
        live = [p for p in batch if not p.done]
        if not live:
            return
        results = await self.executor.infer(slot, [p.payload for p in live])
        for p, r in zip(live, results, strict=True):
            if isinstance(r, BaseException):
                p.fail(r)
            elif not p.resolve(r):
                r.release()

    async def _run_embed(self, slot: Any, batch: list[Pending]) -> None:
        live: list[Pending] = []
        texts: list[str] = []
        for p in batch:
            if p.done:
                continue
            payload = p.payload
            if not isinstance(payload, list | tuple) or not all(
                isinstance(t, str) for t in payload
            ):
                p.fail(RequestError("embed takes a list of strings"))
                continue
            live.append(p)
            texts.extend(payload)
        if not live:
            return
        vecs = await self.executor.embed(slot, texts)
        if vecs.ndim != 2 or vecs.shape[0] != len(texts):
            raise RequestError(
                f"model {self.spec.name!r} returned embeddings of shape {vecs.shape} "
                f"for {len(texts)} texts"
            )
        start = 0
        for p in live:
            n = len(p.payload)
            p.resolve(vecs[start : start + n])
            start += n

    async def submit(
        self, batcher: Batcher[Any] | None, payload: Any, deadline: float | None
    ) -> Any:
        assert batcher is not None
        clock = self.engine.clock
        now = clock()
        dl = self.engine.deadline(deadline)
        if now >= dl:
            raise DeadlineExceeded("the request's deadline passed before it was queued")
        p = Pending(payload, dl, now)

        def expire() -> None:
            queued = p in batcher._queue
            batcher.discard(p)
            where = "while it was queued" if queued else "while it was running"
            p.fail(DeadlineExceeded(f"the request's deadline passed {where}"))

        timer = call_at(clock, dl, expire)
        batcher.submit(p)
        try:
            return await p.future
        except asyncio.CancelledError:
            fut = p.future
            if fut.done() and not fut.cancelled() and fut.exception() is None:
                result = fut.result()
                if isinstance(result, InferResult):
                    result.release()
            raise
        finally:
            timer.cancel()
            batcher.discard(p)


class ModelHandle:
    """What the app layer holds for one model."""

    def __init__(self, runtime: _ModelRuntime) -> None:
        self._rt = runtime
        self.name = runtime.spec.name
        self.capabilities: frozenset[str] = runtime.spec.capabilities
        self.spec = runtime.spec

    @property
    def model(self) -> Model:
        """An instance of the model's class for metadata (inputs/outputs/count_tokens/
        chat_template); not loaded for ``process`` models."""
        return self._rt.meta

    def admit(self) -> Ticket:
        """Admit one request at its head, or raise ``Overloaded(429)``."""
        return self._rt.admission.admit()

    def _require(self, capability: str) -> None:
        if capability not in self.capabilities:
            raise CapabilityError(f"model {self.name!r} does not support {capability}")

    async def infer(
        self, ticket: Ticket, inputs: Mapping[str, Any], *, deadline: float | None = None
    ) -> InferResult:
        """Run one request through the batcher and executor. Release ``result.leases``
        (or call ``result.release()``) once the outputs have been sent."""
        try:
            self._require("infer")
            result: InferResult = await self._rt.submit(self._rt.infer_batcher, inputs, deadline)
            return result
        finally:
            ticket.release()

    def infer_nowait(
        self, inputs: Mapping[str, Any], *, deadline: float | None = None
    ) -> InferResult | None:
        """Run the request synchronously when the batcher would run it at once on the loop
        anyway (inline executor, sync ``infer``, batches of one, nothing queued ahead);
        ``None`` otherwise, and the caller awaits :meth:`infer`. It takes no ticket: the
        caller keeps the admitted one and releases it after a result (or an error)."""
        rt = self._rt
        batcher = rt.infer_batcher
        if rt.spec.max_batch_size != 1 or batcher is None or batcher.queued:
            return None
        if deadline is not None and rt.engine.clock() >= deadline:
            raise DeadlineExceeded("the request's deadline passed before it was queued")
        return rt.executor.infer_now(inputs)

    async def embed(
        self, ticket: Ticket, texts: list[str], *, deadline: float | None = None
    ) -> np.ndarray:
        """float32 embeddings of shape ``(len(texts), dim)``."""
        try:
            self._require("embed")
            out: np.ndarray = await self._rt.submit(self._rt.embed_batcher, list(texts), deadline)
            return out
        finally:
            ticket.release()

    def generate(
        self,
        ticket: Ticket,
        req: GenerateRequest,
        *,
        deadline: float | None = None,
        policy: Policy = "block",
    ) -> Stream:
        """Start a generation; iterate the returned stream for its pieces."""
        rt = self._rt
        try:
            self._require("generate")
            opts = rt.engine.options
            channel = Channel(
                opts.channel_capacity, policy=policy, byte_cap=opts.coalesce_cap_bytes
            )
            dl = rt.engine.deadline(deadline)
            if rt.engine.clock() >= dl:
                raise DeadlineExceeded("the request's deadline passed before it started")
        except BaseException:
            ticket.release()
            raise
        stream = Stream(rt, channel, ticket)
        rt.streams.add(stream)
        stream._timer = call_at(rt.engine.clock, dl, stream._expire)
        stream._producer = rt.executor.generate(req, channel)
        return stream

    def statistics(self) -> ModelStatistics:
        return self._rt.engine._model_statistics(self._rt)


def _pick(value: int | None, default: Any) -> int:
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
        self._models: dict[str, _ModelRuntime] = {}
        self._started = False
        self._closed = False

    # -- lifecycle -----------------------------------------------------------------------
    async def start(self) -> None:
        """Load every model (in parallel). Raises ``ModelLoadError`` naming the first
        model that failed, after stopping the others; never waits longer than
        ``options.load_timeout_s`` per model."""
        runtimes: list[_ModelRuntime] = []
        for name, cfg in self.configs.items():
            spec, meta = self._resolve(name, cfg)
            runtimes.append(_ModelRuntime(self, spec, meta, self._executor(spec, meta)))
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
            rt.start_batchers()
            self._models[rt.spec.name] = rt
        self._started = True
        self._register_metrics()

    async def aclose(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._unregister_metrics()
        for rt in self._models.values():
            await rt.aclose()
        if self._owns_arena:
            self.arena.close()

    async def __aenter__(self) -> Engine:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    def _resolve(self, name: str, cfg: ModelConfig) -> tuple[ModelSpec, Model]:
        try:
            meta = make_model(cfg.factory, cfg.options)
        except Exception as exc:
            raise ModelLoadError(name, f"{type(exc).__name__}: {exc}") from exc
        executor = cfg.executor or getattr(meta, "executor", "inline")
        if executor not in _EXECUTORS:
            raise ModelLoadError(name, f"unknown executor {executor!r}; expected {_EXECUTORS}")
        spec = ModelSpec(
            name=name,
            factory=cfg.factory,
            options=dict(cfg.options),
            executor=executor,
            max_batch_size=_pick(cfg.max_batch_size, getattr(meta, "max_batch_size", 1)),
            max_batch_delay_ms=float(
                cfg.max_batch_delay_ms
                if cfg.max_batch_delay_ms is not None
                else getattr(meta, "max_batch_delay_ms", 5.0)
            ),
            workers=_pick(cfg.workers, getattr(meta, "workers", 1)),
            queue_depth=_pick(cfg.queue_depth, self.options.queue_depth),
            capabilities=type(meta).capabilities(),
        )
        return spec, meta

    def _executor(self, spec: ModelSpec, meta: Model) -> Executor:
        opts = self.options
        if spec.executor == "inline":
            return InlineExecutor(spec, self.arena, model=meta, yield_every=opts.inline_yield_every)
        if spec.executor == "thread":
            return ThreadExecutor(spec, self.arena, model=meta, yield_every=opts.inline_yield_every)
        from .process import ProcessExecutor

        return ProcessExecutor(spec, self.arena, opts)

    # -- queries -------------------------------------------------------------------------
    def ready(self) -> bool:
        """Every model loaded and every worker up."""
        return (
            self._started
            and not self._closed
            and all(rt.executor.ready() for rt in self._models.values())
        )

    def status(self) -> EngineStatus:
        """The lifecycle and every model's workers (what ``/ready`` reports when false)."""
        models: dict[str, ModelStatus] = {}
        for name, rt in self._models.items():
            workers = rt.executor.statistics()
            models[name] = ModelStatus(
                ready=rt.executor.ready(),
                executor=workers.executor,
                workers=workers.workers,
                ready_workers=workers.ready,
            )
        return EngineStatus(started=self._started, closed=self._closed, models=models)

    def names(self) -> list[str]:
        return list(self._models)

    def model(self, name: str) -> ModelHandle:
        rt = self._models.get(name)
        if rt is None:
            # The name is the client's input: not repeated back (GET /v1/models lists them).
            raise ModelNotFound("the requested model is not served")
        return ModelHandle(rt)

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
    def _model_statistics(self, rt: _ModelRuntime) -> ModelStatistics:
        return ModelStatistics(
            queue=rt.admission.statistics(),
            infer_batches=rt.infer_batcher.statistics() if rt.infer_batcher else None,
            embed_batches=rt.embed_batcher.statistics() if rt.embed_batcher else None,
            workers=rt.executor.statistics(),
        )

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
            models={name: self._model_statistics(rt) for name, rt in self._models.items()},
            arena=self.arena.statistics(),
            channels=self._channel_totals(),
            ready=self.ready(),
        )

    _SOURCES = ("queue", "batch", "workers", "arena", "channels")

    def _register_metrics(self) -> None:
        models = self._models
        metrics.register_source(
            "queue", lambda: {n: rt.admission.statistics() for n, rt in models.items()}
        )
        metrics.register_source(
            "batch",
            lambda: {
                n: (rt.infer_batcher or rt.embed_batcher).statistics()  # type: ignore[union-attr]
                for n, rt in models.items()
                if rt.infer_batcher or rt.embed_batcher
            },
        )
        metrics.register_source(
            "workers", lambda: {n: rt.executor.statistics() for n, rt in models.items()}
        )
        metrics.register_source("arena", self.arena.statistics)
        metrics.register_source("channels", self._channel_totals)

    def _unregister_metrics(self) -> None:
        for name in self._SOURCES:
            metrics.unregister_source(name)
