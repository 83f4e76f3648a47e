"""The Ray actor side of ``executor="ray"``: one loaded model serving descriptors.

Strategy
--------
The actor is created with the ingress's :class:`ArenaRef`: the ingress's pid, the
arena's memfd number, its size and token. In ``__init__`` (which Ray reruns on every
restart) it opens ``/proc/<pid>/fd/<fd>``; when that succeeds and the token read from
the file matches, the actor shares the ingress's arena (same node, same user) and from
then on gets only :class:`~..tensors.TensorDesc` descriptors: it reads
``numpy.frombuffer`` views and writes outputs into leases the ingress allocates. When it
fails (another node, another user, ``same_node=never``) the actor is *detached* and the
ingress sends arrays through Ray's object store instead.

Calls (all ``async``: Ray runs them concurrently on the actor's event loop; sync model
code runs on a small thread pool, as in process workers):

* ``infer(id, descs)`` -> ``Done`` (every output already in the arena, or written) or
  ``NeedAlloc(sizes)``; then ``write(id, offsets)`` -> ``Done``. Detached:
  ``infer_arrays(batch)`` -> the model's outputs as arrays.
* ``generate(...)``: a streaming generator of ``("t", str)`` / ``("b", bytes)`` pieces
  (or ``("m", [pieces])``, a batch of them) then one ``("e", finish_reason)``, stepped
  only while the stream has credit (``credit(id, n)``); ``abort(id)`` closes the model's
  generator after the step in progress. The stream ends only once that step returned, so
  a step that never returns keeps the stream's Ray task running, which the ingress
  watches (a hung stream). A sync generator is stepped in slices on a pool thread
  (``stepping.SlicedSteps``, as in process workers), and every Ray item carries whatever
  arrived since the last one, so a fast generator's pieces travel many to an item.

Batches (``infer``, ``infer_arrays``, ``embed``) run one at a time (``serial_batches``):
the ingress keeps up to ``roster.PIPELINE_DEPTH`` of them in flight on one actor so
that the next one is already here when the model finishes the last, but the model sees
them in turn, as in a process worker.

Invariants
----------
* Nothing of a payload is pickled when attached: descriptors, sizes and offsets only.
* A model's exception is returned as ``Failed`` (a 4xx/5xx the ingress rebuilds), never
  raised through Ray, so a Ray error always means the actor or the cluster failed.
"""

from __future__ import annotations

import asyncio
import hmac
import mmap
import os
import socket
import struct
import uuid
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, ClassVar

import msgspec
import numpy as np

from ...models.base import GenerateRequest, Model
from ..arena import read_token
from ..model_calls import check_outputs, make_model, maybe_await, model_failure
from ..stepping import STOPPED, SlicedSteps, StreamCredit
from ..tensors import (
    TensorDesc,
    arena_offset,
    as_array,
    buffer_address,
    bytes_tensor_size,
    from_desc,
    write_pending,
)
from ..worker import wire
from ..worker.loop import WorkerLoop

# Threads for sync model calls in one actor (as ``worker.loop.WORKER_THREADS``).
ACTOR_THREADS = 8


# An attached actor's link socket: an abstract Unix socket (Linux; no file to clean up)
# named for the actor's start, so a restarted actor never answers on its predecessor's.
LINK_PREFIX = "\0zeroserve-link-"
# How long a new link connection may take to send its first frame before it is closed.
LINK_HELLO_TIMEOUT_S = 5.0
# struct ucred (pid, uid, gid), what SO_PEERCRED returns.
_UCRED = struct.Struct("3i")


@dataclass(frozen=True, slots=True)
class ArenaRef:
    """How an actor finds the ingress's arena: by the ingress process's fd table."""

    pid: int
    fd: int
    size: int
    token: bytes


class Done(msgspec.Struct, array_like=True, tag="done"):
    outputs: list[dict[str, TensorDesc]]
    copied: int


class NeedAlloc(msgspec.Struct, array_like=True, tag="alloc"):
    sizes: list[int]


class Failed(msgspec.Struct, array_like=True, tag="fail"):
    """A call's failure as a reply: an errors-module class name, message and status (the
    worker protocol's own failure frame is ``worker.wire.Fail``)."""

    error: str
    message: str
    status: int


Reply = Done | NeedAlloc | Failed
REPLY = msgspec.msgpack.Decoder(Reply)
DESCS = msgspec.msgpack.Decoder(list[dict[str, TensorDesc]])
_encode = msgspec.msgpack.encode


def attach_arena(ref: ArenaRef) -> memoryview | None:
    """Map the ingress's arena if this process can open it and its token matches."""
    try:
        fd = os.open(f"/proc/{ref.pid}/fd/{ref.fd}", os.O_RDWR)
    except OSError:
        return None
    try:
        if read_token(fd, ref.size) != ref.token:
            return None
        return memoryview(mmap.mmap(fd, ref.size, flags=mmap.MAP_SHARED))
    except OSError:
        return None
    finally:
        os.close(fd)


def _fail(name: str, exc: BaseException) -> Failed:
    err = model_failure(name, exc)
    return Failed(type(err).__name__, err.message, err.status)


class RayWorker:
    """One model in one Ray actor (decorated with ``ray.remote`` by the executor)."""

    # Whether the model's batches run one at a time (the ``ray`` executor pipelines
    # them); a Serve replica takes as many as Serve sends it.
    serial_batches: ClassVar[bool] = True
    # Whether an attached actor serves a link (the worker protocol over a socket) to the
    # ingress; a Serve replica is reached through Serve's handles only.
    links: ClassVar[bool] = True

    def __init__(
        self,
        factory: Callable[..., Model],
        options: Mapping[str, Any],
        name: str,
        arena: ArenaRef | None,
    ) -> None:
        self.name = name
        # Which start of this actor answers: Ray restarts an actor under the same handle,
        # and a kill is asynchronous, so the old process may still answer a first ``hello``.
        self.instance = uuid.uuid4().hex
        self.view = attach_arena(arena) if arena is not None else None
        self.base = buffer_address(self.view) if self.view is not None else 0
        self.size = len(self.view) if self.view is not None else 0
        self.pool = ThreadPoolExecutor(ACTOR_THREADS, thread_name_prefix="zeroserve-actor")
        self.model = make_model(factory, options)
        load: Callable[[], Any] = self.model.load  # sync, or async def
        loaded = load()
        if asyncio.iscoroutine(loaded):  # an async load(): __init__ is not on a loop
            asyncio.run(loaded)
        # Serial batches: a sync model's run on their own thread, in turn (a batch that
        # arrives meanwhile waits in its queue), an async model's under a lock.
        self.batch_pool = self.pool
        self.batch_lock: asyncio.Lock | None = None
        if self.serial_batches:
            self.batch_pool = ThreadPoolExecutor(1, thread_name_prefix="zeroserve-batch")
            self.batch_lock = asyncio.Lock()
        self.pending: dict[int, tuple[list[dict[str, TensorDesc]], list[Any]]] = {}
        self.credits: dict[int, StreamCredit] = {}
        self.aborted: set[int] = set()
        self.arena = arena
        self._link_server: asyncio.Server | None = None
        self._linked = False  # a link is being served (one at a time)

    async def hello(self) -> tuple[int, bool, str, str, str]:
        """This actor's pid, whether it shares the ingress's arena, which start of the
        actor this is (``instance``), the address of its link socket ("" when it
        serves no link: not attached, or a Serve replica), and its Ray node's id (the
        ingress measures the RSS of actors on its own node: runtime/model_memory.py)."""
        import ray

        link = await self._listen()
        node = ray.get_runtime_context().get_node_id()
        return os.getpid(), self.view is not None, self.instance, link, node

    # -- the link: the worker protocol over a socket, for the ingress on this node ---------
    async def _listen(self) -> str:
        """Listen on an abstract Unix socket named for this start of the actor (once)."""
        if self.view is None or not self.links:
            return ""
        if self._link_server is None:
            address = LINK_PREFIX + self.instance
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                sock.bind(address)
                sock.listen(1)
                sock.setblocking(False)
                self._link_server = await asyncio.start_unix_server(self._serve_link, sock=sock)
            except OSError:
                sock.close()
                return ""
        return LINK_PREFIX + self.instance

    async def _serve_link(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """One link from the ingress: its process must be the arena's owner and its first
        frame the arena's token; then the worker protocol, until EOF or ``Shutdown``."""
        try:
            ref = self.arena
            sock = writer.get_extra_info("socket")
            creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _UCRED.size)
            peer_pid = _UCRED.unpack(creds)[0]
            msg = wire.LINK.decode(
                await asyncio.wait_for(wire.read_frame(reader), LINK_HELLO_TIMEOUT_S)
            )
            if (
                ref is None
                or self.view is None
                or self._linked
                or peer_pid != ref.pid
                or not hmac.compare_digest(msg.token, ref.token)
            ):
                return
            self._linked = True
            try:
                worker = WorkerLoop(self.model, self.view, writer, self.name)
                writer.write(wire.frame(wire.Ready(os.getpid())))
                await worker.run(reader)
            finally:
                self._linked = False
        except (OSError, TimeoutError, asyncio.IncompleteReadError, msgspec.DecodeError):
            pass
        finally:
            writer.close()

    async def _call(
        self, fn: Callable[..., Any], *args: Any, pool: ThreadPoolExecutor | None = None
    ) -> Any:
        if asyncio.iscoroutinefunction(fn):
            return await fn(*args)
        job = (pool or self.pool).submit(fn, *args)
        running = asyncio.wrap_future(job)
        try:
            return await maybe_await(await asyncio.shield(running))
        except asyncio.CancelledError:
            # Still queued (behind another batch): it never runs. Running: a thread
            # cannot be stopped, so the call (its Ray task) ends when the thread returns,
            # and the ingress sees it running and reclaims the actor if it runs past its
            # deadline plus the hang grace (docs/architecture.md, "Hung work").
            job.cancel()
            await asyncio.wait([running])
            raise

    async def _batch(self, fn: Callable[..., Any], *args: Any) -> Any:
        """``_call`` for a batch or an embedding: one at a time when ``serial_batches``."""
        lock = self.batch_lock
        if lock is None or not asyncio.iscoroutinefunction(fn):
            return await self._call(fn, *args, pool=self.batch_pool)
        async with lock:
            return await fn(*args)

    # -- infer, attached ------------------------------------------------------------------
    async def infer(self, rid: int, descs: bytes) -> bytes:
        view = self.view
        if view is None:
            return _encode(Failed("WorkerError", "actor is not attached to the arena", 503))
        try:
            batch = [
                {k: from_desc(view, d) for k, d in item.items()} for item in DESCS.decode(descs)
            ]
            outs = check_outputs(self.name, len(batch), await self._batch(self.model.infer, batch))
            described: list[dict[str, TensorDesc]] = []
            pending: list[Any] = []
            for out in outs:
                d: dict[str, TensorDesc] = {}
                for key, value in dict(out).items():
                    arr = value if isinstance(value, np.ndarray) else as_array(value, name=key)
                    if arr.dtype == object:
                        flat = arr.reshape(-1)
                        pending.append((d, key, flat, bytes_tensor_size(flat)))
                        continue
                    off = arena_offset(arr, self.base, self.size)
                    if off is not None:
                        d[key] = TensorDesc(off, arr.nbytes, arr.dtype.str, arr.shape)
                    else:
                        pending.append((d, key, arr, arr.nbytes))
                described.append(d)
        except Exception as exc:
            return _encode(_fail(self.name, exc))
        if not pending:
            return _encode(Done(described, 0))
        self.pending[rid] = (described, pending)
        return _encode(NeedAlloc([n for *_, n in pending]))

    async def write(self, rid: int, offsets: list[int]) -> bytes:
        """Write the outputs ``infer`` held back into the leases at ``offsets``; an empty
        list (the ingress could not allocate, or gave up) just drops them."""
        held = self.pending.pop(rid, None)
        if held is None or not offsets or self.view is None:
            return _encode(Failed("WorkerError", "no outputs held for this request", 500))
        described, pending = held
        copied = write_pending(self.view, pending, offsets)
        return _encode(Done(described, copied))

    # -- infer, detached (object store) ---------------------------------------------------
    async def infer_arrays(self, batch: list[dict[str, Any]]) -> Any:
        """Run a batch whose arrays came through the object store (read-only views);
        returns the outputs as arrays, or a ``Failed``'s bytes."""
        try:
            outs = check_outputs(self.name, len(batch), await self._batch(self.model.infer, batch))
            return [{k: as_array(v, name=k) for k, v in dict(o).items()} for o in outs]
        except Exception as exc:
            return _encode(_fail(self.name, exc))

    async def embed(self, texts: list[str]) -> Any:
        try:
            out = await self._batch(self.model.embed, texts)
            return np.ascontiguousarray(np.asarray(out, dtype=np.float32))
        except Exception as exc:
            return _encode(_fail(self.name, exc))

    # -- generate ---------------------------------------------------------------------------
    async def credit(self, rid: int, n: int) -> None:
        c = self.credits.get(rid)
        if c is not None:
            c.add(n)

    async def abort(self, rid: int) -> None:
        c = self.credits.get(rid)
        if c is None:
            return
        self.aborted.add(rid)
        c.add(1 << 30)  # wake a generator waiting for credit, so it sees the abort

    def _piece(self, piece: Any) -> tuple[str, Any]:
        if isinstance(piece, str):
            return ("t", piece)
        if isinstance(piece, bytes):
            return ("b", piece)
        return ("b", bytes(memoryview(piece).cast("B")))

    async def generate(
        self, rid: int, req: bytes, raw: TensorDesc | None, raw_bytes: bytes | None, window: int
    ) -> Any:
        credit = self.credits[rid] = StreamCredit(window)
        try:
            request = msgspec.msgpack.decode(req, type=GenerateRequest)
            if raw is not None and self.view is not None:
                request.raw = self.view[raw.offset : raw.offset + raw.length]
            elif raw_bytes is not None:
                request.raw = raw_bytes
            it = await maybe_await(self.model.generate(request))
            result: Any = None
            if hasattr(it, "__anext__"):
                try:
                    while True:
                        await credit.take()
                        if rid in self.aborted:
                            return
                        try:
                            piece = await it.__anext__()
                        except StopAsyncIteration:
                            break
                        yield self._piece(piece)
                finally:
                    await it.aclose()
            else:
                steps = SlicedSteps(iter(it), self.pool, credit, lambda: rid in self.aborted)
                try:
                    while True:
                        pieces, end = await steps.take()
                        if pieces:
                            yield ("m", [self._piece(piece) for piece in pieces])
                        if end is None:
                            continue
                        if isinstance(end, BaseException):
                            raise end
                        if end is STOPPED:
                            return
                        result = steps.result
                        break
                finally:
                    # A step cannot be stopped: the stream (its Ray task) ends when the
                    # step's thread returns, so the ingress sees it running and reclaims
                    # the actor past the deadline plus the hang grace
                    # (docs/decisions/0020-hung-work-is-reclaimed.md); the generator is
                    # closed after that step. Marked aborted, a pool call stepping it
                    # stops after the step in progress.
                    self.aborted.add(rid)
                    await steps.aclose()
            yield ("e", result if isinstance(result, str) else None)
        except (GeneratorExit, asyncio.CancelledError):
            raise
        except Exception as exc:
            fail = _fail(self.name, exc)
            yield ("f", (fail.error, fail.message, fail.status))
        finally:
            self.credits.pop(rid, None)
            self.aborted.discard(rid)
