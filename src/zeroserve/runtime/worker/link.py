"""The server side of one worker connection: the calls in flight on it and the frames
both ways (:mod:`.wire`).

A link is a connected stream socket to a process serving :class:`~.loop.WorkerLoop`:
a spawned process worker's socketpair (``ProcessExecutor``), or a Ray actor on this
node that attached the arena and accepted a connection (``RayExecutor``; docs/
architecture.md, "Executors: ray"). Whoever owns the link (its :class:`LinkOwner`)
decides what the worker's death means (respawn, or wait for Ray's restart) and how a
hung worker is killed; everything about one call is here.

Strategy
--------
* Inputs: an ndarray that is a view into the arena (the request body) travels as a
  descriptor, and the lease holding it is retained for the call's life; anything else is
  copied once into a new lease, counted at ``copied_bytes{site=<sites.input>}``.
* Outputs: the worker describes arrays already in the arena by offset and writes other
  outputs into leases it asks this side to allocate (``Alloc``). Every lease a call
  touches is recorded on its :class:`Call`; the leases backing its outputs are retained
  into ``InferResult.leases`` and the call's own references are dropped when the worker
  sends the call's terminal frame, or when the link is lost (``fail_calls``).
* Streams: per-stream credits (``Generate.window`` = the channel's capacity); the
  consumer taking pieces returns credits (``block``), or credits return on receipt
  (``coalesce``). A ``Pieces`` frame carries several pieces, each one credit.
* Hung work: every call carries its deadline (loop time); one still in flight
  ``hang_grace_s`` past it is reported to the owner (``LinkOwner.hung``), which kills the
  worker; the link's EOF then fails its calls. A call abandoned earlier (its round trip
  cancelled, its stream aborted, its consumer gone: ``abandon``) is sent an ``Abort``
  and its grace starts then, at min(deadline, now)
  (docs/decisions/0025-abandoned-work-grace-starts-at-abandonment.md).

Invariants
----------
* Every call sent gets exactly one terminal frame (``InferDone``, ``EmbedDone``, ``End``
  or ``Fail``) or is failed by ``fail_calls``: its leases are released exactly once.
* Everything here runs on the event-loop thread.
"""

from __future__ import annotations

import asyncio
import itertools
import socket
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import msgspec
import numpy as np

from ... import errors, metrics
from ...errors import Overloaded, WorkerError, WouldBlock
from ...models.base import GenerateRequest
from ..arena import Arena, Lease
from ..channel import Channel
from ..inproc import validate_inputs
from ..results import InferResult
from ..tensors import (
    BYTES,
    TensorDesc,
    arena_offset,
    as_array,
    bytes_tensor_size,
    from_desc,
    write_bytes_tensor,
)
from . import wire as p

if TYPE_CHECKING:
    from ..options import RuntimeOptions


def rebuild_error(name: str, message: str, status: int) -> errors.ZeroserveError:
    """A worker's ``Fail`` (an errors-module class name, message, status) as the error the
    caller gets: the same class where it exists, else ``WorkerError``."""
    cls = errors.error_class(name)
    if cls is not None:
        try:
            return cls(message, status=status)  # type: ignore[call-arg]
        except TypeError:
            pass
    return WorkerError(message, status=status if status >= 500 else 500)


def loop_now() -> float | None:
    """Event-loop time, the clock of calls' ``deadline_at``; None off the loop (nothing
    counts as overdue there)."""
    try:
        return asyncio.get_running_loop().time()
    except RuntimeError:
        return None


@dataclass(frozen=True, slots=True)
class CopySites:
    """Where a link counts the copies it makes: inputs copied into the arena, outputs
    copied out of a frame (``copied_bytes{site=...}``)."""

    input: str
    output: str


class Call:
    """One request (or batch, or stream) in flight on a worker."""

    __slots__ = (
        "abandoned",
        "channel",
        "credit",
        "deadline_at",
        "future",
        "hang_timer",
        "id",
        "kind",
        "leases",
        "window",
    )

    def __init__(self, rid: int, kind: str, deadline_at: float | None = None) -> None:
        self.id = rid
        self.kind = kind
        self.leases: list[Lease] = []
        self.future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self.channel: Channel | None = None
        self.abandoned = False
        self.credit = 0
        self.window = 0
        self.deadline_at = deadline_at
        self.hang_timer: asyncio.TimerHandle | None = None

    def overdue(self, now: float | None) -> bool:
        return self.deadline_at is not None and now is not None and now >= self.deadline_at

    def release(self) -> None:
        """The call ended (its terminal frame came, or its link was lost)."""
        if self.hang_timer is not None:
            self.hang_timer.cancel()
            self.hang_timer = None
        leases, self.leases = self.leases, []
        for lease in leases:
            lease.release()


class LinkOwner(Protocol):
    """The executor a link belongs to: it learns when a call ended (its slots) and when
    one hangs (it kills the worker)."""

    @property
    def options(self) -> RuntimeOptions: ...

    def call_ended(self, link: WorkerLink, call: Call) -> None: ...

    def hung(self, link: WorkerLink, call: Call) -> None: ...


class LinkStream:
    """A stream running on a link: ``abort`` tells the worker to stop it."""

    __slots__ = ("call", "link")

    def __init__(self, link: WorkerLink, call: Call) -> None:
        self.link = link
        self.call = call

    def abort(self) -> None:
        self.link.abandon(self.call)


class WorkerLink:
    """The server's side of one connected worker: its socket and calls in flight."""

    __slots__ = (
        "_ids",
        "arena",
        "busy",
        "calls",
        "hung",
        "index",
        "owner",
        "pid",
        "reader",
        "ready",
        "sites",
        "sock",
        "task",
        "writer",
    )

    def __init__(
        self,
        owner: LinkOwner,
        arena: Arena,
        index: int,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        sock: socket.socket,
        pid: int,
        sites: CopySites,
    ) -> None:
        self.owner = owner
        self.arena = arena
        self.index = index
        self.reader = reader
        self.writer = writer
        self.sock = sock
        self.pid = pid
        self.sites = sites
        self.calls: dict[int, Call] = {}
        self.ready = True
        # A batch slot is held until the batch's end (call_ended): the process executor's
        # from acquire on; the ray executor's only past release, for an abandoned batch.
        self.busy = False
        self.hung = False  # killed for a hung call; its EOF is not counted as a crash
        self.task: asyncio.Task[None] | None = None  # the owner's task running read()
        self._ids = itertools.count(1)

    def send(self, msg: Any) -> None:
        if not self.writer.is_closing():
            self.writer.write(p.frame(msg))

    @property
    def streams(self) -> int:
        return sum(1 for c in self.calls.values() if c.kind == "stream")

    def batch_running(self) -> bool:
        """A batch (infer/embed) is still running here, abandoned or not: the worker's
        slot stays taken until it ends."""
        return any(c.kind != "stream" for c in self.calls.values())

    def usable(self, now: float | None) -> bool:
        """Ready, and not running a call past its deadline (a worker that may be hung
        gets no new work)."""
        return self.ready and not self.hung and not any(c.overdue(now) for c in self.calls.values())

    # -- reading -----------------------------------------------------------------------------
    async def read(self) -> BaseException | None:
        """Read and dispatch frames until the link ends: None at EOF, or the protocol error
        that makes the worker untrustworthy (its owner kills it)."""
        try:
            while True:
                self._dispatch(p.TO_SERVER.decode(await p.read_frame(self.reader)))
        except (asyncio.IncompleteReadError, ConnectionError, OSError):
            return None
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # a protocol error: the worker is not trustworthy
            return exc

    async def aclose(self) -> None:
        """Close the socket now (not on a later loop turn), so no fd outlives it. uvloop
        transports work on a duplicate of the socket, so the original is closed too."""
        self.writer.close()
        try:
            await self.writer.wait_closed()
        except (ConnectionError, OSError):
            pass
        self.sock.close()

    def fail_calls(self, exc: errors.ZeroserveError) -> None:
        calls = list(self.calls.values())
        self.calls.clear()
        for call in calls:
            call.release()
            if call.channel is not None:
                call.channel.abort(exc) if not call.channel.closed else None
            elif not call.future.done():
                call.future.set_exception(exc)

    def _dispatch(self, msg: Any) -> None:
        if isinstance(msg, p.Pieces):
            self._pieces(msg)
            return
        if isinstance(msg, p.Alloc):
            self._allocate(msg)
            return
        if not isinstance(msg, p.InferDone | p.EmbedDone | p.End | p.Fail):
            return  # no other frame belongs to a call
        call = self.calls.pop(msg.id, None)
        if call is None:
            return
        try:
            if isinstance(msg, p.InferDone):
                self._infer_done(call, msg)
            elif isinstance(msg, p.EmbedDone):
                metrics.count_copy(self.sites.output, len(msg.data))
                vecs = np.frombuffer(msg.data, dtype=np.float32).reshape(msg.shape)
                if not call.future.done():
                    call.future.set_result(vecs)
            elif isinstance(msg, p.End):
                if call.channel is not None:
                    call.channel.close(result=msg.result)
            elif isinstance(msg, p.Fail):
                exc = rebuild_error(msg.error, msg.message, msg.status)
                if call.channel is not None:
                    if not call.abandoned:
                        call.channel.close(exc)
                elif not call.future.done():
                    call.future.set_exception(exc)
        finally:
            call.release()
            self.owner.call_ended(self, call)

    def _pieces(self, msg: p.Pieces) -> None:
        call = self.calls.get(msg.id)
        if call is None or call.abandoned or call.channel is None:
            return
        channel = call.channel
        view = self.arena.view
        for item in msg.items:
            piece: Any
            if isinstance(item, str):
                piece = item
            elif isinstance(item, p.Blob):
                piece = item.data
            else:
                piece = view[item.offset : item.offset + item.length]
            try:
                channel.send_nowait(piece)
            except WouldBlock:
                self.abandon(call)
                channel.abort(WorkerError("worker sent a piece beyond its credit"))
                return
            except errors.ZeroserveError:
                self.abandon(call)  # consumer gone, or coalesce cap passed
                return
        if channel.policy == "coalesce":
            self._return_credit(call, len(msg.items))

    def abandon(self, call: Call) -> None:
        """``call``'s requests are gone (its round trip cancelled, its stream aborted, its
        consumer gone mid-pieces): tell the worker to stop it, and give it
        ``hang_grace_s`` from now (from its deadline, if that passed already) to end
        before its worker counts as hung. The worker is not taken out of scheduling
        meanwhile: an abort the worker honours at once would otherwise cost every stream a
        client stops its worker until the ``End``
        (docs/decisions/0025-abandoned-work-grace-starts-at-abandonment.md)."""
        if call.abandoned:
            return
        call.abandoned = True
        if call.id not in self.calls:
            return  # it ended already
        self.send(p.Abort(call.id))
        now = asyncio.get_running_loop().time()
        self._watch(call, now if call.deadline_at is None else min(call.deadline_at, now))

    def _return_credit(self, call: Call, n: int) -> None:
        if call.abandoned or call.id not in self.calls:
            return
        call.credit += n
        if call.credit >= max(1, call.window // 2):
            self.send(p.Credit(call.id, call.credit))
            call.credit = 0

    def _allocate(self, msg: p.Alloc) -> None:
        call = self.calls.get(msg.id)
        if call is None:
            self.send(p.Allocated(msg.id, [], "unknown request"))
            return
        leases: list[Lease] = []
        try:
            for n in msg.sizes:
                leases.append(self.arena.allocate(n))
        except Overloaded as exc:
            for lease in leases:
                lease.release()
            self.send(p.Allocated(msg.id, [], exc.message))
            return
        call.leases.extend(leases)
        self.send(p.Allocated(msg.id, [lease.offset for lease in leases]))

    def _infer_done(self, call: Call, msg: p.InferDone) -> None:
        if msg.copied:
            metrics.count_copy(self.sites.output, msg.copied)
        if call.future.done():
            return
        results: list[InferResult] = []
        try:
            for described in msg.outputs:
                outputs: dict[str, Any] = {}
                held: list[Lease] = []
                for key, desc in described.items():
                    lease = _owner(call, desc)
                    arr = from_desc(self.arena.view, desc)
                    if desc.dtype == BYTES:
                        metrics.count_copy(self.sites.output, desc.length)
                    outputs[key] = arr
                    if all(lease is not h for h in held):
                        held.append(lease.retain())
                results.append(InferResult(outputs, held))
        except Exception as exc:
            for r in results:
                r.release()
            call.future.set_exception(WorkerError(f"bad output from worker: {exc}"))
            return
        call.future.set_result(results)

    # -- calls -------------------------------------------------------------------------------
    def _register(self, call: Call) -> None:
        """Put ``call`` in flight here, watched for hanging past its deadline."""
        self.calls[call.id] = call
        if call.deadline_at is not None:
            self._watch(call, call.deadline_at)

    def _watch(self, call: Call, since: float) -> None:
        """``call`` is hung if it is still in flight ``hang_grace_s`` after ``since``
        (loop time): its deadline, or the moment it was abandoned."""
        if call.hang_timer is not None:
            call.hang_timer.cancel()
        when = since + self.owner.options.hang_grace_s
        call.hang_timer = asyncio.get_running_loop().call_at(when, self._hung, call)

    def _hung(self, call: Call) -> None:
        if call.id in self.calls and not self.hung:
            self.owner.hung(self, call)

    def describe(self, arr: np.ndarray, call: Call) -> TensorDesc:
        """``arr`` as a descriptor into the arena; the lease holding it is kept on ``call``."""
        return describe(self.arena, arr, call.leases, self.sites.input)

    async def _roundtrip(self, call: Call, msg: Any) -> Any:
        self._register(call)
        self.send(msg)
        try:
            return await call.future
        except asyncio.CancelledError:
            self.abandon(call)
            raise

    async def infer(
        self, batch: list[Mapping[str, Any]], deadline_at: float | None
    ) -> list[InferResult | BaseException]:
        """Run one batch; a request whose inputs are invalid fails alone."""
        call = Call(next(self._ids), "infer", deadline_at)
        results: list[InferResult | BaseException] = []
        sent: list[dict[str, TensorDesc]] = []
        index: list[int] = []
        for i, inputs in enumerate(batch):
            try:
                validate_inputs(inputs)
                sent.append(
                    {k: self.describe(as_array(v, name=k), call) for k, v in inputs.items()}
                )
                index.append(i)
                results.append(WorkerError("unreachable"))
            except Exception as exc:  # this request's preprocessing failed: it alone
                results.append(exc)
        if not sent:
            call.release()
            return results
        outs: list[InferResult] = await self._roundtrip(call, p.Infer(call.id, sent))
        for i, out in zip(index, outs, strict=True):
            results[i] = out
        return results

    async def embed(self, texts: list[str], deadline_at: float | None) -> np.ndarray:
        call = Call(next(self._ids), "embed", deadline_at)
        out: np.ndarray = await self._roundtrip(call, p.Embed(call.id, texts))
        return out

    def start_stream(
        self, req: GenerateRequest, channel: Channel, deadline_at: float | None
    ) -> LinkStream:
        """Send ``req`` to the worker as a stream into ``channel`` (credit: the channel's
        capacity); its pieces, end or failure arrive through the channel."""
        call = Call(next(self._ids), "stream", deadline_at)
        call.channel = channel
        call.window = channel.capacity
        raw: TensorDesc | None = None
        try:
            if req.raw is not None:
                raw = self.describe(as_array(req.raw, name="raw"), call)
                req = msgspec.structs.replace(req, raw=None)
        except BaseException:
            call.release()
            raise
        self._register(call)
        if channel.policy == "block":
            channel.on_take = lambda n: self._return_credit(call, n)
        self.send(p.Generate(call.id, msgspec.msgpack.encode(req), raw, call.window))
        return LinkStream(self, call)


def describe(arena: Arena, arr: np.ndarray, leases: list[Lease], site: str) -> TensorDesc:
    """``arr`` as a descriptor into ``arena``: in place when it is already there (the lease
    holding it retained into ``leases``), else copied once into a new lease (counted at
    ``site``). BYTES tensors are laid out in a new lease."""
    if arr.dtype == object:
        items = arr.reshape(-1)
        n = bytes_tensor_size(items)
        lease = arena.allocate(n)
        leases.append(lease)
        write_bytes_tensor(list(items), lease.view)
        metrics.count_copy(site, n)
        return TensorDesc(lease.offset, n, BYTES, (len(items),))
    off = arena_offset(arr, arena.address, arena.size)
    if off is not None:
        owner = arena.lease_containing(off, arr.nbytes)
        if owner is not None:
            leases.append(owner.retain())
            return TensorDesc(off, arr.nbytes, arr.dtype.str, arr.shape)
    lease = arena.allocate(arr.nbytes)
    leases.append(lease)
    if arr.nbytes:
        flat = np.ascontiguousarray(arr).reshape(-1).view(np.uint8)
        np.frombuffer(lease.view, dtype=np.uint8)[:] = flat
        metrics.count_copy(site, arr.nbytes)
    return TensorDesc(lease.offset, arr.nbytes, arr.dtype.str, arr.shape)


def _owner(call: Call, desc: TensorDesc) -> Lease:
    for lease in call.leases:
        if lease.offset <= desc.offset and desc.offset + desc.length <= lease.offset + lease.block:
            return lease
    raise WorkerError("worker described memory outside the request's leases")
