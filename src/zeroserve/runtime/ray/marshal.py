"""Payloads to and from Ray actors that are called through Ray (not through a link).

Strategy
--------
* *Attached* (the actor mapped our arena: same node): inputs travel as descriptors, the
  leases holding them retained for the call; outputs already in the arena come back as
  descriptors, others are written by the actor into leases allocated here (one more
  actor call, ``write``). Nothing of the payload is pickled.
* *Detached* (another node, or ``same_node=never``): the batch goes into Ray's object
  store with one ``ray.put`` (counted ``copied_bytes{site="ray_put"}``) and the outputs
  come back through it (counted ``ray_get``); the model reads Ray's read-only views.

Every copy made here is counted: ``ray_input`` for inputs copied into the arena,
``ray_output`` for outputs the actor wrote into leases, ``ray_put`` and ``ray_get`` for
the object store. The calls themselves are the caller's (a fleet's ``call``), so the
same marshalling serves actors and Serve replicas.

Invariant: the leases a call allocates or retains are released when it returns; those
backing its outputs are retained into each ``InferResult`` first.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import msgspec
import numpy as np

from ... import errors, metrics
from ...errors import WorkerError
from ...models.base import GenerateRequest
from ..arena import Arena, Lease
from ..results import InferResult
from ..tensors import TensorDesc, as_array, from_desc
from ..worker.link import CopySites, describe, rebuild_error
from . import actor as a
from .roster import RayWorkerHandle

# Where a link counts its copies: the same sites as an attached actor's Ray calls.
SITES = CopySites(input="ray_input", output="ray_output")

# A fleet's way to await one Ray call on a worker, ``call(w, ref, deadline_at)``.
Caller = Callable[[RayWorkerHandle, Any, float | None], Awaitable[Any]]


def rebuild(fail: a.Failed) -> errors.ZeroserveError:
    """An actor's ``Failed`` reply as the error the caller gets."""
    return rebuild_error(fail.error, fail.message, fail.status)


def reply_error(out: bytes) -> errors.ZeroserveError:
    """The error of a call that answered with a reply's bytes instead of its outputs."""
    reply = a.REPLY.decode(out)
    return rebuild(reply) if isinstance(reply, a.Failed) else WorkerError("bad reply")


def describe_input(arena: Arena, arr: np.ndarray, leases: list[Lease]) -> TensorDesc:
    """``arr`` as a descriptor into the arena (copied in, counted, if not already)."""
    return describe(arena, arr, leases, SITES.input)


def stream_raw(
    arena: Arena, req: GenerateRequest, leases: list[Lease], attached: bool
) -> tuple[TensorDesc | None, bytes | None]:
    """A stream request's raw input as a descriptor into the arena (``attached``), or as
    bytes through Ray (counted ``ray_put``); None, None without one."""
    if req.raw is None:
        return None, None
    arr = as_array(req.raw, name="raw")
    if attached:
        return describe_input(arena, arr, leases), None
    raw_bytes = np.ascontiguousarray(arr).tobytes()
    metrics.count_copy("ray_put", len(raw_bytes))
    return None, raw_bytes


def result(arena: Arena, described: dict[str, TensorDesc], leases: list[Lease]) -> InferResult:
    """One request's outputs, described in the arena inside ``leases`` (retained)."""
    outputs: dict[str, Any] = {}
    held: list[Lease] = []
    for key, desc in described.items():
        owner = next(
            (
                lease
                for lease in leases
                if lease.offset <= desc.offset
                and desc.offset + desc.length <= lease.offset + lease.block
            ),
            None,
        )
        if owner is None:
            for lease in held:
                lease.release()
            raise WorkerError("actor described memory outside the request's leases")
        outputs[key] = from_desc(arena.view, desc)
        if all(owner is not h for h in held):
            held.append(owner.retain())
    return InferResult(outputs, held)


async def infer_attached(
    arena: Arena,
    call: Caller,
    w: RayWorkerHandle,
    rid: int,
    arrays: list[dict[str, np.ndarray]],
    deadline_at: float | None,
) -> list[InferResult]:
    """Run a batch on an attached actor: descriptors in; descriptors, or outputs the
    actor writes into leases allocated here (``NeedAlloc``, then ``write``), out."""
    leases: list[Lease] = []
    try:
        descs = [{k: describe_input(arena, v, leases) for k, v in item.items()} for item in arrays]
        reply = a.REPLY.decode(
            await call(w, w.actor.infer.remote(rid, msgspec.msgpack.encode(descs)), deadline_at)
        )
        if isinstance(reply, a.NeedAlloc):
            try:
                out_leases = [arena.allocate(n) for n in reply.sizes]
            except errors.Overloaded:
                w.actor.write.remote(rid, [])
                raise
            leases.extend(out_leases)
            reply = a.REPLY.decode(
                await call(
                    w, w.actor.write.remote(rid, [lease.offset for lease in out_leases]), None
                )
            )
        if isinstance(reply, a.Failed):
            raise rebuild(reply)
        assert isinstance(reply, a.Done)
        if reply.copied:
            metrics.count_copy("ray_output", reply.copied)
        return [result(arena, item, leases) for item in reply.outputs]
    finally:
        for lease in leases:
            lease.release()


async def infer_detached(
    call: Caller,
    w: RayWorkerHandle,
    arrays: list[dict[str, np.ndarray]],
    deadline_at: float | None,
) -> list[InferResult]:
    """Run a batch through the object store: one ``ray.put`` in, arrays out."""
    import ray

    metrics.count_copy("ray_put", sum(v.nbytes for item in arrays for v in item.values()))
    ref = await asyncio.get_running_loop().run_in_executor(None, ray.put, arrays)
    out = await call(w, w.actor.infer_arrays.remote(ref), deadline_at)
    if isinstance(out, bytes):
        raise reply_error(out)
    results: list[InferResult] = []
    for item in out:
        metrics.count_copy("ray_get", sum(np.asarray(v).nbytes for v in item.values()))
        results.append(InferResult(dict(item)))
    return results


def embedding(out: Any) -> np.ndarray:
    """An ``embed`` call's answer as the vectors (counted ``ray_get``), or its error."""
    if isinstance(out, bytes):
        raise reply_error(out)
    metrics.count_copy("ray_get", out.nbytes)
    vecs: np.ndarray = np.asarray(out)
    return vecs
