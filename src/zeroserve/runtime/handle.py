"""A served model: :class:`ModelRuntime` (what the engine runs for it) and
:class:`ModelHandle` (what the app layer holds)."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from .. import metrics
from ..errors import (
    CapabilityError,
    DeadlineExceeded,
    Overloaded,
    RequestError,
    ZeroserveError,
)
from ..models.base import GenerateRequest, Model
from .admission import Admission, AdmissionStatistics, QueueWatch, Ticket
from .batcher import Batcher, BatcherStatistics, Pending
from .channel import Channel, Policy
from .classes import DEFAULT_PRIORITY, ClassStatistics, Priority, merge_classes
from .clock import Clock, call_at
from .contract import Executor
from .load_reasons import public_reason
from .options import ResolvedModel, RuntimeOptions
from .results import InferResult, WorkerStatistics
from .slots import SlotPool, SlotStatistics
from .stream import Stream
from .timing import StreamTiming


@dataclass(frozen=True, slots=True)
class ModelStatistics:
    queue: AdmissionStatistics
    infer_batches: BatcherStatistics | None
    embed_batches: BatcherStatistics | None
    workers: WorkerStatistics
    slots: SlotStatistics | None = None  # an engine's slots (llama.cpp), when it has them


@dataclass(frozen=True, slots=True)
class ModelStatus:
    """One model's readiness, as ``/ready`` reports it."""

    ready: bool
    executor: str
    workers: int
    ready_workers: int
    # Why the model cannot take work (``ModelRuntime.refusal``): hung work, workers being
    # restarted, a lost cluster; or why it cannot serve though it takes work (``fault``).
    reason: str | None = None


class ModelRuntime:
    """One loaded model: its admission, batchers, executor and open streams."""

    def __init__(
        self,
        spec: ResolvedModel,
        meta: Model,
        executor: Executor,
        *,
        clock: Clock,
        options: RuntimeOptions,
    ) -> None:
        self.clock = clock
        self.options = options
        self.spec = spec
        self.meta = meta
        self.executor = executor
        self.admission = Admission(spec.name, spec.queue_depth, clock)
        self.streams: set[Stream] = set()
        self.generation = metrics.generation_metrics(spec.name)
        self.infer_batcher: Batcher[Any] | None = None
        self.embed_batcher: Batcher[Any] | None = None
        # An engine that schedules its own work (llama.cpp's): its slots, once loaded.
        self.slots: SlotPool | None = None

    def start_slots(self) -> None:
        """Give a loaded model whose engine has slots its pool (``Model.slot_count``)."""
        count = self.meta.slot_count()
        if count:
            self.slots = SlotPool(
                self.spec.name,
                count,
                byte_cap=self.options.coalesce_cap_bytes,
                clock=self.clock,
                aging_s=self.options.priority_aging_s,
            )

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
            clock=self.clock,
            acquire=ex.acquire,
            release=ex.release,
            run=run,
            name=f"{spec.name}-{kind}",
            aging_s=self.options.priority_aging_s,
        )
        batcher.start()
        return batcher

    async def aclose(self) -> None:
        for b in (self.infer_batcher, self.embed_batcher):
            if b is not None:
                await b.aclose()
        for s in list(self.streams):
            s._abort()
        if self.slots is not None:
            self.slots.close()
        await self.executor.aclose()

    async def _run_infer(self, slot: Any, batch: list[Pending]) -> None:
        live = [p for p in batch if not p.done]
        if not live:
            return
        _started(live)
        results = await self.executor.infer(
            slot, [p.payload for p in live], deadline_at=self._loop_deadline(live)
        )
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
        _started(live)
        vecs = await self.executor.embed(slot, texts, deadline_at=self._loop_deadline(live))
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

    def deadline(self, deadline: float | None) -> float:
        """The absolute deadline of a request (the model's limit from now if ``None``)."""
        if deadline is None:
            return self.clock() + self.spec.deadline_s
        return deadline

    def loop_time(self, deadline: float) -> float:
        """A deadline on the engine's clock as event-loop time (executors' timers)."""
        return asyncio.get_running_loop().time() + (deadline - self.clock())

    def _loop_deadline(self, batch: list[Pending]) -> float:
        return self.loop_time(max(p.deadline for p in batch))

    def no_capacity(self) -> Overloaded:
        return Overloaded(
            f"model {self.spec.name!r} has no working worker: every one is running a call "
            "past its deadline (hung); retry later",
            status=503,
            retry_after=self.options.hang_grace_s,
        )

    def refusal(self) -> ZeroserveError | None:
        """The one answer to "no worker or slot can take work now": the error admission
        refuses a request with at the head, and the reason ``/ready`` gives; None while
        the model can take work (docs/architecture.md, "Hung work")."""
        ex = self.executor
        if ex.has_capacity():
            return None
        return ex.unavailable() or self.no_capacity()

    def statistics(self) -> ModelStatistics:
        return ModelStatistics(
            queue=self.admission.statistics(),
            infer_batches=self.infer_batcher.statistics() if self.infer_batcher else None,
            embed_batches=self.embed_batcher.statistics() if self.embed_batcher else None,
            workers=self.worker_statistics(),
            slots=self.slots.statistics() if self.slots is not None else None,
        )

    def class_statistics(self) -> dict[Priority, ClassStatistics]:
        """The model's waits per class, over its batchers' queues and its engine slots."""
        parts = [b.class_statistics() for b in (self.infer_batcher, self.embed_batcher) if b]
        if self.slots is not None:
            parts.append(self.slots.class_statistics())
        return merge_classes(parts)

    def worker_statistics(self) -> WorkerStatistics:
        """The executor's workers, with the child processes an in-process model runs
        itself: their unasked deaths are crashes, their new starts restarts."""
        workers = self.executor.statistics()
        children = self.meta.child_health()
        if children.deaths == 0 and children.restarts == 0:
            return workers
        return dataclasses.replace(
            workers,
            crashes=workers.crashes + children.deaths,
            restarts=workers.restarts + children.restarts,
        )

    def fault(self) -> str | None:
        """Why the model cannot serve now though it takes requests: its engine's child
        process died and a new one does not answer yet (the next request waits for it);
        server paths shortened (docs/models.md, "Models at run time")."""
        down = self.meta.child_health().down
        return public_reason(down) if down is not None else None

    def ready(self) -> bool:
        return self.executor.ready() and self.meta.child_health().down is None

    def status(self) -> ModelStatus:
        workers = self.worker_statistics()
        why = self.refusal()
        return ModelStatus(
            ready=self.ready(),
            executor=workers.executor,
            workers=workers.workers,
            ready_workers=workers.ready,
            reason=why.message if why is not None else self.fault(),
        )

    async def submit(
        self,
        batcher: Batcher[Any] | None,
        payload: Any,
        deadline: float | None,
        watch: QueueWatch | None = None,
        priority: Priority = DEFAULT_PRIORITY,
    ) -> Any:
        assert batcher is not None
        clock = self.clock
        now = clock()
        dl = self.deadline(deadline)
        if now >= dl:
            raise DeadlineExceeded("the request's deadline passed before it was queued")
        p = Pending(payload, dl, now, watch, priority)
        if watch is not None:
            watch.queued()

        def expire() -> None:
            queued = batcher.is_queued(p)
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


def _started(batch: list[Pending]) -> None:
    """A slot starts ``batch``: its requests' queue wait is over (tracing)."""
    for p in batch:
        if p.watch is not None:
            p.watch.started()


class ModelHandle:
    """What the app layer holds for one model."""

    def __init__(self, runtime: ModelRuntime) -> None:
        self._rt = runtime
        self.clock = runtime.clock  # the engine's clock, which deadlines are on
        self.name = runtime.spec.name
        self.capabilities: frozenset[str] = runtime.spec.capabilities
        self.spec = runtime.spec

    @property
    def model(self) -> Model:
        """An instance of the model's class for metadata (inputs/outputs/count_tokens/
        chat_template); not loaded for ``process`` models."""
        return self._rt.meta

    @property
    def slots(self) -> SlotPool:
        """The engine slots of a model that has them (``Model.slot_count``)."""
        slots = self._rt.slots
        if slots is None:
            raise CapabilityError(f"model {self.name!r} has no engine slots")
        return slots

    def deadline(self, timeout_s: float | None = None) -> float:
        """The absolute deadline of a request starting now: ``timeout_s`` (the client's
        own), capped by the model's limit (``ModelConfig.deadline_s``)."""
        limit = self.spec.deadline_s
        return self._rt.clock() + (limit if timeout_s is None else min(timeout_s, limit))

    def admit(self, priority: Priority = DEFAULT_PRIORITY) -> Ticket:
        """Admit one request of class ``priority`` at its head, or raise ``Overloaded``:
        429 when the queue is full, 503 when no worker can take work
        (``ModelRuntime.refusal``: hung, restarting, cluster lost;
        docs/decisions/0025-abandoned-work-grace-starts-at-abandonment.md)."""
        rt = self._rt
        why = rt.refusal()
        if why is not None:
            raise why
        return rt.admission.admit(priority)

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
            result: InferResult = await self._rt.submit(
                self._rt.infer_batcher, inputs, deadline, ticket.watch, ticket.priority
            )
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
        if deadline is not None and rt.clock() >= deadline:
            raise DeadlineExceeded("the request's deadline passed before it was queued")
        return rt.executor.infer_now(inputs)

    async def embed(
        self, ticket: Ticket, texts: list[str], *, deadline: float | None = None
    ) -> np.ndarray:
        """float32 embeddings of shape ``(len(texts), dim)``."""
        try:
            self._require("embed")
            out: np.ndarray = await self._rt.submit(
                self._rt.embed_batcher, list(texts), deadline, ticket.watch, ticket.priority
            )
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
            opts = rt.options
            channel = Channel(
                opts.channel_capacity, policy=policy, byte_cap=opts.coalesce_cap_bytes
            )
            dl = rt.deadline(deadline)
            if rt.clock() >= dl:
                raise DeadlineExceeded("the request's deadline passed before it started")
        except BaseException:
            ticket.release()
            raise
        stream = Stream(channel, ticket, rt.streams.discard, StreamTiming(rt.generation, rt.clock))
        rt.streams.add(stream)
        stream._timer = call_at(rt.clock, dl, stream._expire)
        watch = ticket.watch
        if watch is not None:
            watch.queued()
        stream._producer = rt.executor.generate(
            req,
            channel,
            deadline_at=rt.loop_time(dl),
            on_start=None if watch is None else watch.started,
        )
        return stream

    def statistics(self) -> ModelStatistics:
        return self._rt.statistics()
