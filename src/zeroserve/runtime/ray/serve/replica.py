"""The Ray side of ``executor=ray-serve``: what runs in Ray's processes, never in the
ingress's (docs/architecture.md, "Elastic: executor=ray-serve").

Strategy
--------
A replica is a :class:`ServeReplica`, the ``ray`` executor's actor logic
(:class:`~..actor.RayWorker`: arena attach by ``/proc/<pid>/fd``, descriptors, the
model's threads, ``Failed`` replies) with one call per request instead of two, since
Serve may route a follow-up call to another replica:

* ``infer_once(id, descs)`` on a replica that attached the ingress's arena: inputs are
  read from the arena; outputs already in it come back as descriptors, the others as
  arrays through Serve's response. ``None``: not attached (the ingress resends the batch
  through the object store to ``infer_arrays``).
* ``generate_stream``: the actor's own generator (``RayWorker.generate``, the same items,
  the same credit window). A follow-up call could land on another replica, so credit
  and abort do not come as replica calls: the replica long-polls the model's
  :class:`StreamControl` (``take``), one Ray call per returned half window, and stops
  on ``STOP``. A raw input given as a descriptor to a replica that did not attach gets
  ``("x", None)`` alone: the ingress reopens the stream with the bytes.

:class:`StreamControl` is a small actor on the ingress's node: the ingress adds credit
and aborts, a replica takes.

Invariants
----------
* Replicas are not serial (Serve sends up to ``max_ongoing_requests`` at once) and never
  serve a link (Serve's handles route every call).
* A ``take`` for a stream the ingress already closed answers ``STOP`` (the last
  ``CLOSED_STREAMS_KEPT`` closed ids are remembered), so no replica waits forever.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from collections.abc import AsyncIterator, Callable, Mapping
from typing import Any, ClassVar

import msgspec
import numpy as np

from ....models.base import Model
from ...stepping import StreamCredit
from ...tensors import TensorDesc
from .. import actor as a

# Streams a StreamControl remembers as closed, so that a replica's ``take`` arriving
# after the ingress closed the stream answers "stop" instead of waiting forever; far more
# than the streams one model has open at once.
CLOSED_STREAMS_KEPT = 4096
# ``take``'s answer once a stream is aborted or closed.
STOP = -1


class ServeReplica(a.RayWorker):
    """One Serve replica: the ``ray`` actor's logic, one call per request."""

    # Serve sends a replica up to ``max_ongoing_requests`` calls at once; they run at once.
    serial_batches: ClassVar[bool] = False
    links: ClassVar[bool] = False

    def __init__(
        self,
        factory: Callable[..., Model],
        options: Mapping[str, Any],
        name: str,
        arena: a.ArenaRef | None,
    ) -> None:
        super().__init__(factory, options, name, arena)

    async def infer_once(
        self, rid: int, descs: bytes
    ) -> tuple[bytes, list[tuple[int, str, np.ndarray]]] | None:
        """``infer`` on the arena; outputs the ingress would have to allocate come back
        as arrays (item index, name, array). ``None``: not attached, send arrays."""
        if self.view is None:
            return None
        reply = a.REPLY.decode(await self.infer(rid, descs))
        if not isinstance(reply, a.NeedAlloc):
            return msgspec.msgpack.encode(reply), []
        described, pending = self.pending.pop(rid)
        index = {id(d): i for i, d in enumerate(described)}
        arrays = [(index[id(d)], key, arr) for d, key, arr, _ in pending]
        return msgspec.msgpack.encode(a.Done(described, 0)), arrays

    async def generate_stream(
        self,
        rid: int,
        req: bytes,
        raw: TensorDesc | None,
        raw_bytes: bytes | None,
        window: int,
        control: Any,
    ) -> AsyncIterator[tuple[str, Any]]:
        """``RayWorker.generate``'s items, with credit and abort fed from ``control``;
        ``("x", None)`` alone when ``raw`` is a descriptor and this replica did not
        attach the arena (the ingress resends the bytes)."""
        if raw is not None and self.view is None:
            yield ("x", None)
            return
        items = self.generate(rid, req, raw, raw_bytes, window)
        feeder = asyncio.get_running_loop().create_task(self._feed(rid, control))
        try:
            async for item in items:
                yield item
        finally:
            feeder.cancel()
            await items.aclose()

    async def _feed(self, rid: int, control: Any) -> None:
        while True:
            n = await control.take.remote(rid)
            if n == STOP:
                await self.abort(rid)
                return
            await self.credit(rid, n)


class StreamControl:
    """The credit and abort side of one model's Serve streams (a Ray actor on the
    ingress's node): the ingress adds credit and aborts, a replica takes."""

    def __init__(self) -> None:
        self.credits: dict[int, StreamCredit] = {}
        self.stopped: set[int] = set()
        self.closed: OrderedDict[int, None] = OrderedDict()

    def _get(self, rid: int) -> StreamCredit:
        c = self.credits.get(rid)
        if c is None:
            c = self.credits[rid] = StreamCredit(0)
        return c

    async def credit(self, rid: int, n: int) -> None:
        if rid not in self.closed:
            self._get(rid).add(n)

    async def abort(self, rid: int) -> None:
        if rid not in self.closed:
            self.stopped.add(rid)
            self._get(rid).add(1)

    async def close(self, rid: int) -> None:
        self.closed[rid] = None
        while len(self.closed) > CLOSED_STREAMS_KEPT:
            self.closed.popitem(last=False)
        self.stopped.add(rid)
        c = self.credits.pop(rid, None)
        if c is not None:
            c.add(1)  # wake a waiting take, which answers STOP

    async def take(self, rid: int) -> int:
        """Wait for credit returned on stream ``rid`` and take all of it; ``STOP`` once
        the stream was aborted or closed."""
        if rid in self.closed:
            return STOP
        c = self._get(rid)
        await c.take()
        if rid in self.stopped:
            self.stopped.discard(rid)
            self.credits.pop(rid, None)
            return STOP
        n, c.n = 1 + c.n, 0
        return n
