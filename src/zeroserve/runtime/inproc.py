"""The in-process executors: ``inline`` (on the event loop) and ``thread`` (a pool).

Strategy
--------
* ``inline`` calls the model on the loop. Async methods are awaited; sync ones run to
  completion on the loop, which is the point of ``inline`` (async or trivial models).
  A sync generator is pulled on the loop, but the pump yields to the loop whenever the
  channel is full (it awaits room) and every ``yield_every`` pieces regardless, so a fast
  generator under the ``coalesce`` policy (which never blocks) cannot starve the loop.
* ``thread`` runs sync methods in a pool of ``workers`` threads, for models that release
  the GIL (numpy, onnxruntime, torch). A sync generator is stepped one ``next()`` per
  pool call, and only once the channel has room, so a slow consumer stops the model
  instead of buffering its output. A lock serialises ``next()`` and ``close()`` so an
  abort that lands mid-step closes the generator right after that step (queued once the
  step returned: a hung step holds one thread, not two). Async methods run on the loop.
* Hung work (``thread``): a thread cannot be killed, so work abandoned by its requests
  (a batch, or a stream's step) keeps its thread until it returns; still running
  ``hang_grace_s`` past its abandonment (its deadline, or its client's disconnect) it is
  counted ``stuck``: it holds its slot or thread; capacity is a slot and a thread not
  stuck (docs/decisions/0020-hung-work-is-reclaimed.md).

Invariants
----------
* At most ``workers`` batches run at once (the slots), whatever the executor.
* Every generation ends with the channel closed: normally, with the model's error, or
  already aborted by its consumer or deadline.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import inspect
import itertools
import logging
from collections.abc import Callable, Generator, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any, cast

import numpy as np

from ..errors import ModelLoadError, RequestError, WouldBlock
from ..models.base import GenerateRequest, Model
from .arena import Arena
from .channel import Channel
from .classes import DEFAULT_AGING_S, Priority
from .contract import Executor, Producer
from .model_calls import check_outputs, make_model, maybe_await, model_failure, output_leases
from .options import DEFAULT_HANG_GRACE_S, DEFAULT_YIELD_EVERY, ResolvedModel
from .priority import call_lowered, lower_thread
from .results import InferResult, WorkerStatistics
from .stepping import ThreadStepper
from .waiters import RankedSemaphore

log = logging.getLogger("zeroserve.runtime")

# Threads beyond ``workers`` in a ``thread`` pool, for stepping generators.
STREAM_THREADS = 4


def validate_inputs(inputs: Any) -> Mapping[str, Any]:
    """Per-request preprocessing: a mapping of names to arrays or buffers."""
    if type(inputs) is not dict and not isinstance(inputs, Mapping):  # dict: no ABC check
        raise RequestError(
            f"inputs must be a mapping of name to tensor, not {type(inputs).__name__}"
        )
    for key, value in inputs.items():
        if not isinstance(key, str):
            raise RequestError("input names must be strings")
        if not isinstance(value, np.ndarray | bytes | bytearray | memoryview):
            raise RequestError(
                f"input {key!r} must be a numpy array or a buffer, not {type(value).__name__}",
                param=key,
            )
    return inputs


class _TaskProducer(Producer):
    def __init__(self, task: asyncio.Task[None]) -> None:
        self.task = task

    def abort(self) -> None:
        self.task.cancel()


class _DoneProducer(Producer):
    """A generation that failed before it started (its channel is already closed)."""

    def abort(self) -> None:
        pass


class _Outcome:
    """How a pulled generator ended: its return value, or the error it raised."""

    __slots__ = ("error", "result")

    def __init__(self) -> None:
        self.result: Any = None
        self.error: Exception | None = None


def _delegate(gen: Iterator[Any], outcome: _Outcome) -> Generator[Any, None, None]:
    """``gen``'s pieces; its return value or error is kept in ``outcome`` (closing this
    generator closes ``gen``)."""
    try:
        # A plain iterator returns None; a generator its return value (the finish reason).
        outcome.result = yield from cast(Generator[Any, None, Any], gen)
    except Exception as exc:
        outcome.error = exc


class _PullProducer(Producer):
    def __init__(self, gen: Generator[Any, None, None], executor: InProcessExecutor) -> None:
        self.gen = gen
        self.executor = executor
        self.done = False

    def finish(self) -> None:
        if not self.done:
            self.done = True
            self.executor._streams -= 1

    def abort(self) -> None:
        if not self.done:
            self.finish()
            self.gen.close()  # closes the model's generator too (``_delegate``)


class _Slot:
    """Work on a pool thread that may outlive its requests: one of the ``workers`` batch
    slots while taken (``step`` false), or a stream's step whose stream ended while it
    ran (``step`` true). ``running``: the pool thread's future of the call (thread
    executor), so a slot whose call was abandoned stays taken until that thread
    returns."""

    __slots__ = ("deadline_at", "running", "step", "stuck")

    def __init__(self, *, step: bool = False) -> None:
        self.running: concurrent.futures.Future[Any] | None = None
        self.deadline_at: float | None = None
        self.stuck = False
        self.step = step


class InProcessExecutor(Executor):
    """Shared by ``inline`` and ``thread``; ``pool`` is None for ``inline``.

    Hung work (thread): a thread cannot be killed. A slot whose call was abandoned (its
    requests expired or went away) stays taken until the call's thread returns; if that
    is ``hang_grace_s`` past its abandonment the slot is counted ``stuck``. A stream
    step still running when its stream ended is watched the same way, and once stuck it
    holds one of the pool's threads. With no slot that is not stuck, or no thread left
    for one, the model has no capacity: ``ready()`` is false and admission answers 503.
    """

    kind = "inline"

    def __init__(
        self,
        spec: ResolvedModel,
        arena: Arena,
        *,
        model: Model | None = None,
        yield_every: int = DEFAULT_YIELD_EVERY,
        hang_grace_s: float = DEFAULT_HANG_GRACE_S,
        aging_s: float = DEFAULT_AGING_S,
    ) -> None:
        super().__init__(spec, arena)
        self.model: Model | None = model
        self.pool: ThreadPoolExecutor | None = None
        self.yield_every = max(1, yield_every)
        self.hang_grace_s = hang_grace_s
        self._slots = RankedSemaphore(spec.workers, aging_s)  # taken by class
        # Pool threads (thread executor): ``workers`` for batches plus the stream threads.
        self._threads = spec.workers
        self._busy = 0
        self._stuck = 0  # stuck batch slots (each holds a slot and a thread)
        self._stuck_steps = 0  # stuck stream steps (each holds a thread)
        self._streams = 0
        self._ready = False
        self._async_infer: bool | None = None  # known after the first infer_now
        # Whether ``generate`` is a plain or generator function (not async): known after
        # the first stream, not asked of ``inspect`` again for every one.
        self._sync_generate: bool | None = None

    # -- lifecycle -----------------------------------------------------------------------
    async def start(self, timeout: float) -> None:
        try:
            model = self.model or make_model(self.spec.factory, self.spec.options)
            if type(model).runs_own_threads and not inspect.iscoroutinefunction(model.load):
                # Its threads inherit the priority of the thread that starts them.
                await asyncio.wait_for(call_lowered(model.load, self.spec.nice), timeout)
            else:
                await asyncio.wait_for(self._call(model.load), timeout)
        except TimeoutError:
            raise ModelLoadError(self.spec.name, f"load() did not finish in {timeout} s") from None
        except Exception as exc:
            raise ModelLoadError(self.spec.name, f"{type(exc).__name__}: {exc}") from exc
        self.model = model
        self._ready = True

    def ready(self) -> bool:
        return self._ready and self.has_capacity()

    def has_capacity(self) -> bool:
        return self._capacity() > 0

    def _capacity(self) -> int:
        """Batches that could run now: slots not stuck, each needing a pool thread that
        is not stuck either."""
        free_slots = self.spec.workers - self._stuck
        if self.pool is None:
            return free_slots
        return max(0, min(free_slots, self._threads - self._stuck - self._stuck_steps))

    async def aclose(self) -> None:
        self._ready = False
        if self.pool is not None:
            self.pool.shutdown(wait=False, cancel_futures=True)
        if self.model is not None:
            await asyncio.to_thread(self.model.close)

    def local_pids(self) -> list[int]:  # the child processes the model runs, if any
        return self.model.processes() if self.model is not None else []

    async def _call(
        self,
        fn: Callable[..., Any],
        *args: Any,
        slot: _Slot | None = None,
        deadline_at: float | None = None,
    ) -> Any:
        if self.pool is None or inspect.iscoroutinefunction(fn):
            return await maybe_await(fn(*args))
        running = self.pool.submit(fn, *args)
        if slot is not None:
            slot.running = running
            slot.deadline_at = deadline_at
        return await maybe_await(await asyncio.wrap_future(running))

    # -- batches -------------------------------------------------------------------------
    async def acquire(self, priority: Priority, arrived: float) -> _Slot:
        await self._slots.acquire(priority, arrived)
        self._busy += 1
        return _Slot()

    def release(self, slot: Any) -> None:
        s: _Slot = slot
        running = s.running
        if running is None or running.done():
            self._free(s)
            return
        # Abandoned while its thread runs: the slot stays taken until the thread returns.
        self._watch(s, running)

    def _watch(self, slot: _Slot, running: concurrent.futures.Future[Any]) -> None:
        """``slot``'s work was abandoned while its thread runs: free it when the thread
        returns, and count it stuck if that is not within the hang grace of its
        abandonment (or of its deadline, if that came first)."""
        loop = asyncio.get_running_loop()

        def returned(_: concurrent.futures.Future[Any]) -> None:
            try:
                loop.call_soon_threadsafe(self._free, slot)
            except RuntimeError:  # the loop is closed: the engine is gone
                pass

        running.add_done_callback(returned)
        # Its grace starts now, when it was abandoned (its deadline, if that passed
        # already): docs/decisions/0025-abandoned-work-grace-starts-at-abandonment.md.
        now = loop.time()
        since = now if slot.deadline_at is None else min(slot.deadline_at, now)
        loop.call_at(since + self.hang_grace_s, self._hung, slot)

    def _hung(self, slot: _Slot) -> None:
        if slot.running is None or slot.running.done() or slot.stuck:
            return
        slot.stuck = True
        if slot.step:
            self._stuck_steps += 1
        else:
            self._stuck += 1
        log.warning(
            "model %r: a %s %s ran %.1f s past its deadline; its thread is stuck "
            "(%d of %d slots and %d of %d threads stuck)",
            self.spec.name,
            self.kind,
            "stream step" if slot.step else "call",
            self.hang_grace_s,
            self._stuck,
            self.spec.workers,
            self._stuck + self._stuck_steps,
            self._threads,
        )

    def _free(self, slot: _Slot) -> None:
        if slot.stuck:
            slot.stuck = False
            if slot.step:
                self._stuck_steps -= 1
            else:
                self._stuck -= 1
            log.warning("model %r: a stuck call returned; its thread is free again", self.spec.name)
        slot.running = None
        if not slot.step:
            self._busy -= 1
            self._slots.release()

    async def infer(
        self, slot: Any, batch: list[Mapping[str, Any]], *, deadline_at: float | None = None
    ) -> list[InferResult | BaseException]:
        assert self.model is not None
        results: list[InferResult | BaseException] = []
        good: list[Mapping[str, Any]] = []
        index: list[int] = []
        for i, inputs in enumerate(batch):
            try:
                good.append(validate_inputs(inputs))
                index.append(i)
                results.append(RequestError("unreachable"))
            except Exception as exc:
                results.append(exc)
        if not good:
            return results
        try:
            outputs = check_outputs(
                self.spec.name,
                len(good),
                await self._call(self.model.infer, good, slot=slot, deadline_at=deadline_at),
            )
        except Exception as exc:
            raise model_failure(self.spec.name, exc) from exc
        for i, out in zip(index, outputs, strict=True):
            out = dict(out)
            results[i] = InferResult(out, output_leases(self.arena, out))
        return results

    def infer_now(self, inputs: Mapping[str, Any]) -> InferResult | None:
        # The fast path of the raw and V2 endpoints: a sync model on the inline executor
        # would run on the loop anyway; running it here saves the batcher's task switch,
        # futures and timers (most of the per-request cost of a trivial model).
        model = self.model
        if self.pool is not None or model is None or self._slots.locked():
            return None
        if self._async_infer is None:
            self._async_infer = inspect.iscoroutinefunction(model.infer)
        if self._async_infer:
            return None
        validate_inputs(inputs)
        self._busy += 1
        try:
            outputs = check_outputs(self.spec.name, 1, model.infer([inputs]))
        except Exception as exc:
            raise model_failure(self.spec.name, exc) from exc
        finally:
            self._busy -= 1
        out = dict(outputs[0])
        return InferResult(out, output_leases(self.arena, out))

    async def embed(
        self, slot: Any, texts: list[str], *, deadline_at: float | None = None
    ) -> np.ndarray:
        assert self.model is not None
        try:
            out = await self._call(self.model.embed, texts, slot=slot, deadline_at=deadline_at)
        except Exception as exc:
            raise model_failure(self.spec.name, exc) from exc
        return np.asarray(out, dtype=np.float32)

    # -- generation ----------------------------------------------------------------------
    def generate(
        self,
        req: GenerateRequest,
        channel: Channel,
        *,
        deadline_at: float | None = None,
        on_start: Callable[[], None] | None = None,
    ) -> Producer:
        model = self.model
        assert model is not None
        it: Any = None
        if self._sync_generate is None:
            gen = model.generate
            self._sync_generate = not (
                inspect.iscoroutinefunction(gen) or inspect.isasyncgenfunction(gen)
            )
        # Coalesce wants a producer that runs ahead, so only "block" channels step inline.
        if self.pool is None and channel.policy == "block" and self._sync_generate:
            # Inline: the call would happen on the loop anyway, now: no queue wait.
            if on_start is not None:
                on_start()
            try:
                it = model.generate(req)
            except Exception as exc:
                channel.close(model_failure(self.spec.name, exc))
                return _DoneProducer()
            if hasattr(it, "__next__"):
                return self._pulled(cast(Iterator[Any], it), channel)
        task = asyncio.get_running_loop().create_task(
            self._pump(req, channel, it, on_start, deadline_at)
        )
        return _TaskProducer(task)

    def _pulled(self, gen: Iterator[Any], channel: Channel) -> Producer:
        """A sync iterator on the inline executor runs on the loop anyway: let the
        consumer pull it (no task, no queue; see channel.py). A batch is made by C-level
        ``list(islice(...))`` over a delegating generator that keeps the model's return
        value (its finish reason) and its error, so the pieces made before an error are
        still sent."""
        name = self.spec.name
        outcome = _Outcome()
        wrapped = _delegate(gen, outcome)
        producer = _PullProducer(wrapped, self)
        self._streams += 1
        islice = itertools.islice

        def pull(n: int) -> list[Any]:
            pieces = list(islice(wrapped, n))
            if len(pieces) < n:  # the generator ended (or failed): close the channel
                producer.finish()
                error = outcome.error
                if error is not None:
                    channel.close(model_failure(name, error))
                else:
                    channel.close(result=outcome.result)
            return pieces

        channel.puller = pull
        return producer

    async def _pump(
        self,
        req: GenerateRequest,
        channel: Channel,
        it: Any = None,
        on_start: Callable[[], None] | None = None,
        deadline_at: float | None = None,
    ) -> None:
        assert self.model is not None
        self._streams += 1
        if on_start is not None:  # the task runs: the loop (or a thread, next) starts it
            on_start()
        try:
            if it is None:
                generate = self.model.generate
                if self.pool is not None and _plain_function(generate):
                    # Its work happens in the call, before the first piece: on a pool
                    # thread, as the first step, not on the loop (a hang there would
                    # stop the server; as a step it is watched like any other).
                    it = _called_in_first_step(generate, req)
                else:
                    it = generate(req)
            it = await maybe_await(it)
            result: Any = None
            if hasattr(it, "__anext__"):
                # Closed after the handler, not in a ``finally``: compiled code must not
                # await inside one (docs/decisions/0009-no-await-in-handlers-when-compiled.md).
                failure: BaseException | None = None
                try:
                    async for piece in it:
                        await channel.send(piece)
                except BaseException as exc:
                    failure = exc
                aclose = getattr(it, "aclose", None)
                if aclose is not None:
                    await aclose()
                if failure is not None:
                    raise failure
            elif self.pool is None:
                result = await self._pump_inline(iter(it), channel)
            else:
                result = await self._pump_thread(iter(it), channel, deadline_at)
            channel.close(result=result)
        except asyncio.CancelledError:
            channel.close()
            raise
        except Exception as exc:
            if not channel.closed:
                channel.close(model_failure(self.spec.name, exc))
        finally:
            self._streams -= 1

    async def _pump_inline(self, gen: Iterator[Any], channel: Channel) -> Any:
        """Pull ``gen`` into ``channel``; returns the generator's return value."""
        n = 0
        try:
            while True:
                try:
                    piece = next(gen)
                except StopIteration as stop:
                    return stop.value
                full = False
                try:
                    channel.send_nowait(piece)
                except WouldBlock:
                    full = True  # waited for below, outside the handler
                if full:
                    await channel.send(piece)
                n += 1
                if n % self.yield_every == 0:
                    await asyncio.sleep(0)
        finally:
            close = getattr(gen, "close", None)
            if close is not None:
                close()

    async def _pump_thread(
        self, gen: Iterator[Any], channel: Channel, deadline_at: float | None
    ) -> Any:
        """Step ``gen`` in the pool into ``channel``; returns the generator's return value.
        A step still running when the stream ends (aborted, expired) is watched like an
        abandoned batch (``_watch``), and the generator is closed once it returned."""
        pool = self.pool
        assert pool is not None
        stepper = ThreadStepper(gen)
        step: concurrent.futures.Future[Any] | None = None
        try:
            while True:
                await channel.wait_writable()
                step = pool.submit(stepper.step)
                piece = await asyncio.wrap_future(step)
                if piece is ThreadStepper.END:
                    return stepper.result
                await channel.send(piece)
        finally:
            if step is None or step.done():
                stepper.close_in(pool)
            else:
                # Closing now would take a second thread to wait on the step's lock.
                step.add_done_callback(lambda _: stepper.close_in(pool))
                held = _Slot(step=True)
                held.running = step
                held.deadline_at = deadline_at
                self._watch(held, step)

    def statistics(self) -> WorkerStatistics:
        return WorkerStatistics(
            executor=self.kind,
            workers=self.spec.workers,
            ready=self._capacity() if self._ready else 0,
            busy=self._busy,
            streams=self._streams,
            restarts=0,
            crashes=0,
            stuck=self._stuck + self._stuck_steps,
        )


class InlineExecutor(InProcessExecutor):
    kind = "inline"


class ThreadExecutor(InProcessExecutor):
    kind = "thread"

    def __init__(
        self,
        spec: ResolvedModel,
        arena: Arena,
        *,
        model: Model | None = None,
        yield_every: int = DEFAULT_YIELD_EVERY,
        hang_grace_s: float = DEFAULT_HANG_GRACE_S,
        aging_s: float = DEFAULT_AGING_S,
    ) -> None:
        super().__init__(spec, arena, model=model, yield_every=yield_every, aging_s=aging_s)
        self.hang_grace_s = hang_grace_s
        # Slots bound concurrent batches to ``workers``; the extra threads serve stream
        # steps (one short ``next()`` each) so streams never queue behind a long batch.
        self._threads = spec.workers + STREAM_THREADS
        self.pool = ThreadPoolExecutor(
            max_workers=self._threads,
            thread_name_prefix=f"zeroserve-{spec.name}",
            initializer=lower_thread,  # model work runs below the loop (runtime/priority.py)
            initargs=(spec.nice,),
        )


def _plain_function(fn: Callable[..., Any]) -> bool:
    """Neither a generator nor a coroutine function: calling it runs its body."""
    return not (
        inspect.isgeneratorfunction(fn)
        or inspect.iscoroutinefunction(fn)
        or inspect.isasyncgenfunction(fn)
    )


def _called_in_first_step(
    generate: Callable[[GenerateRequest], Any], req: GenerateRequest
) -> Generator[Any, None, Any]:
    """A plain ``generate``, called by the first ``next()`` (a pool thread's step): its
    pieces, and the return value of the sync iterator it returns."""
    it = generate(req)
    if not hasattr(it, "__next__") and not hasattr(it, "__iter__"):
        raise TypeError(
            "generate on the thread executor must be a generator, an async generator, "
            f"or return a sync iterable, not {type(it).__name__}"
        )
    return (yield from iter(it))
