"""The worker side of the worker protocol: one loaded model serving the frames of one
link (:mod:`.wire`). A spawned process worker runs it (``process.worker``), and so does a
same-node Ray actor for the link the ingress opened to it (``ray.actor``).

Strategy
--------
The loop runs on an asyncio event loop (uvloop in a process worker, Ray's in an actor)
and sync model code in a small thread pool. Why a loop and not a thread per stream: one
loop multiplexes every control frame (new requests, credits, aborts) for all streams, so
an abort or a credit is handled within one loop turn however busy the model is; sync
model calls (``infer``, ``embed``, one ``next()`` of a generator) run in the pool, so a
long ``infer`` never delays another stream's credits; async models run on the loop
directly. A generator is stepped only while its stream has credit, so a slow stream
stops its own generator and nobody else's; an ``Abort`` cancels the stream's task, which
closes the generator right after the step in progress (the W6 path).

Invariants
----------
* Every request id gets exactly one terminal frame (see ``wire``). For an aborted call
  running sync model code, it is sent only once that code returned: until then the
  server counts the call as running, which is how it finds a hung worker.
* Outputs that are already in the arena (an echo of its input) are described by offset:
  no copy. Anything else is written once into leases the server allocates on request.
* When the server goes away (EOF on the link), ``run`` returns.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import msgspec
import numpy as np

from ... import errors
from ...models.base import GenerateRequest, Model
from ..model_calls import check_outputs, maybe_await, model_failure, run_to_end
from ..stepping import SlicedSteps, StreamCredit
from ..tensors import (
    TensorDesc,
    arena_offset,
    as_array,
    buffer_address,
    bytes_tensor_size,
    from_desc,
    write_pending,
)
from . import wire as p

# Threads for sync model calls in one worker: a batch or two plus stepping a handful of
# concurrent generators. Fewer cost throughput: 32 tinyllm streams on one core gave 0.80x
# the tokens/s with 1 thread (smaller frames, more of the loop's time), though the event
# loop then waited less for the core (docs/decisions/0002-loop-real-time-priority.md).
WORKER_THREADS = 8


def _never() -> bool:
    return False


class WorkerLoop:
    """The worker side: serves one model's requests from the server's frames."""

    def __init__(self, model: Model, view: memoryview, writer: asyncio.StreamWriter, name: str):
        self.model = model
        self.view = view
        self.base = buffer_address(view)
        self.size = len(view)
        self.writer = writer
        self.name = name
        self.pool = ThreadPoolExecutor(WORKER_THREADS, thread_name_prefix="zeroserve-worker")
        self.tasks: dict[int, asyncio.Task[None]] = {}
        self.credits: dict[int, StreamCredit] = {}
        self.allocs: dict[int, asyncio.Future[p.Allocated]] = {}

    def send(self, msg: Any) -> None:
        self.writer.write(p.frame(msg))

    async def run(self, reader: asyncio.StreamReader) -> None:
        loop = asyncio.get_running_loop()
        while True:
            try:
                msg = p.TO_WORKER.decode(await p.read_frame(reader))
            except (asyncio.IncompleteReadError, ConnectionError):
                break  # the server went away
            if isinstance(msg, p.Infer):
                self._spawn(msg.id, self._infer(msg))
            elif isinstance(msg, p.Credit):
                c = self.credits.get(msg.id)
                if c is not None:
                    c.add(msg.n)
            elif isinstance(msg, p.Generate):
                self.credits[msg.id] = StreamCredit(msg.window)
                self._spawn(msg.id, self._generate(msg))
            elif isinstance(msg, p.Abort):
                t = self.tasks.get(msg.id)
                if t is not None:
                    t.cancel()
            elif isinstance(msg, p.Allocated):
                fut = self.allocs.pop(msg.id, None)
                if fut is not None and not fut.done():
                    fut.set_result(msg)
            elif isinstance(msg, p.Embed):
                self._spawn(msg.id, self._embed(msg))
            elif isinstance(msg, p.Shutdown):
                break
        for t in list(self.tasks.values()):
            t.cancel()
        await asyncio.gather(*self.tasks.values(), return_exceptions=True)
        try:
            await asyncio.wait_for(self.writer.drain(), 1.0)
        except Exception:
            pass
        self.pool.shutdown(wait=False, cancel_futures=True)
        del loop

    def _spawn(self, rid: int, coro: Any) -> None:
        task = asyncio.get_running_loop().create_task(self._guard(rid, coro))
        self.tasks[rid] = task

    async def _guard(self, rid: int, coro: Any) -> None:
        try:
            await coro
        except asyncio.CancelledError:
            self.send(p.Fail(rid, "Closed", "aborted", 499))
        except BaseException as exc:
            err = model_failure(self.name, exc)
            self.send(p.Fail(rid, type(err).__name__, err.message, err.status))
        finally:
            self.tasks.pop(rid, None)
            self.credits.pop(rid, None)
            self.allocs.pop(rid, None)

    async def _call(self, fn: Callable[..., Any], *args: Any) -> Any:
        if asyncio.iscoroutinefunction(fn):
            return await fn(*args)
        loop = asyncio.get_running_loop()
        # An Abort answers only once the thread returned, so the server sees a hung call.
        return await maybe_await(await run_to_end(loop.run_in_executor(self.pool, fn, *args)))

    async def _alloc(self, rid: int, sizes: list[int]) -> list[int]:
        fut: asyncio.Future[p.Allocated] = asyncio.get_running_loop().create_future()
        self.allocs[rid] = fut
        self.send(p.Alloc(rid, sizes))
        msg = await fut
        if msg.error:
            raise errors.Overloaded(msg.error, status=503)
        return msg.offsets

    # -- infer / embed ---------------------------------------------------------------------
    async def _infer(self, msg: p.Infer) -> None:
        batch = [{k: from_desc(self.view, d) for k, d in item.items()} for item in msg.batch]
        outs = check_outputs(self.name, len(batch), await self._call(self.model.infer, batch))
        # Describe outputs: in place when already in the arena, else into new leases.
        described: list[dict[str, TensorDesc]] = []
        pending: list[tuple[dict[str, TensorDesc], str, np.ndarray, int]] = []
        for out in outs:
            d: dict[str, TensorDesc] = {}
            for key, value in dict(out).items():
                arr = value if isinstance(value, np.ndarray) else as_array(value, name=key)
                if arr.dtype == object:
                    pending.append((d, key, arr.reshape(-1), bytes_tensor_size(arr.reshape(-1))))
                    continue
                off = arena_offset(arr, self.base, self.size)
                if off is not None:
                    d[key] = TensorDesc(off, arr.nbytes, arr.dtype.str, arr.shape)
                else:
                    pending.append((d, key, arr, arr.nbytes))
            described.append(d)
        copied = 0
        if pending:
            offsets = await self._alloc(msg.id, [n for *_, n in pending])
            copied = write_pending(self.view, pending, offsets)
        self.send(p.InferDone(msg.id, described, copied))

    async def _embed(self, msg: p.Embed) -> None:
        out = np.ascontiguousarray(
            np.asarray(await self._call(self.model.embed, msg.texts), dtype=np.float32)
        )
        self.send(p.EmbedDone(msg.id, out.tobytes(), out.shape))

    # -- generate --------------------------------------------------------------------------
    def _item(self, piece: Any) -> str | p.Blob | p.InArena:
        if isinstance(piece, str):
            return piece
        mv = memoryview(piece).cast("B")
        if mv.nbytes:
            addr = buffer_address(mv)
            if self.base <= addr and addr + mv.nbytes <= self.base + self.size:
                return p.InArena(addr - self.base, mv.nbytes)
        return p.Blob(bytes(mv))

    async def _generate(self, msg: p.Generate) -> None:
        req = msgspec.msgpack.decode(msg.req, type=GenerateRequest)
        if msg.raw is not None:
            req.raw = self.view[msg.raw.offset : msg.raw.offset + msg.raw.length]
        credit = self.credits[msg.id]
        it = await maybe_await(self.model.generate(req))
        result: Any = None
        if hasattr(it, "__anext__"):
            try:
                while True:
                    await credit.take()
                    try:
                        piece = await it.__anext__()
                    except StopAsyncIteration:
                        break
                    self.send(p.Pieces(msg.id, [self._item(piece)]))
                    await self.writer.drain()
            finally:
                aclose = getattr(it, "aclose", None)
                if aclose is not None:
                    await aclose()
        else:
            # Stepped in slices on a pool thread: what a slice produced goes out as one
            # frame, so a fast generator costs a thread hop and a frame per batch of
            # pieces, not per piece. An Abort cancels this task; the generator is closed
            # once the step in progress returned (until then the call counts as running).
            steps = SlicedSteps(iter(it), self.pool, credit, _never)
            try:
                while True:
                    pieces, end = await steps.take()
                    if pieces:
                        self.send(p.Pieces(msg.id, [self._item(x) for x in pieces]))
                        await self.writer.drain()
                    if end is None:
                        continue
                    if isinstance(end, BaseException):
                        raise end
                    result = steps.result
                    break
            finally:
                await steps.aclose()
        self.send(p.End(msg.id, result if isinstance(result, str) else None))
