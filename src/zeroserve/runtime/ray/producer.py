"""A Ray executor's streams: one :class:`RayProducer` per generation, feeding its channel.

Strategy
--------
A stream goes to the worker ``Roster.pick`` chooses. On a linked actor it is the worker
protocol's, as a process worker's (``WorkerLink.start_stream``). Otherwise it is a Ray
streaming generator of tagged items (``actor.RayWorker.generate``), reached through a
:class:`StreamFeed`: the actor itself (``ray``) or a Serve deployment's handle
(``ray-serve``), which also says where credit and abort go.

Credit: the actor may run ``window`` pieces ahead of the consumer (``STREAM_WINDOW``,
wider than the channel, because each credit return is an actor call and each stream
item a Ray round trip). Pieces beyond what the channel holds wait in ``backlog``
(bounded by the window: more is a protocol error that aborts the stream), refilled into
the channel as the consumer takes pieces; the end of the stream closes the channel only
behind the backlog. Credit goes back in one call per half window consumed (``block``)
or received (``coalesce``).

Abort (disconnect, deadline) tells the worker to stop; a stream with a deadline is then
watched by the supervisor, which reclaims its actor if the actor's stream does not end
within the hang grace (docs/architecture.md, "Hung work").

Invariants
----------
* The channel is closed exactly once: with the result, the model's error, or the Ray
  failure, behind any backlog.
* The leases a stream's raw input holds are released when its task ends.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import AsyncIterator, Callable
from typing import Any, Protocol

from ... import errors
from ...errors import WorkerError, WouldBlock
from ...models.base import GenerateRequest
from ..arena import Lease
from ..channel import Channel
from ..contract import Producer
from ..worker.link import LinkStream
from . import actor as a
from .marshal import rebuild
from .roster import RayWorkerHandle, Roster
from .supervision import Supervisor

# A Ray stream's credit window, in pieces: what the actor may produce ahead of the
# consumer. Wider than the channel (8 pieces), because each credit return is an actor call
# and each Ray stream item a round trip: the pieces beyond the channel wait in the
# producer's ``backlog`` (bounded by this window), credit goes back once half of it was
# consumed. 64 short pieces are a few KiB per stream.
STREAM_WINDOW = 64


class StreamFeed(Protocol):
    """Where one Ray stream's items come from and where its credit and abort go: the actor
    running it (``ray``), or a Serve deployment's handle and the model's control actor
    (``ray-serve``)."""

    def control(self, w: RayWorkerHandle) -> Any:
        """The Ray actor taking the stream's ``credit`` and ``abort`` calls."""
        ...

    def items(
        self,
        w: RayWorkerHandle,
        rid: int,
        req: GenerateRequest,
        window: int,
        leases: list[Lease],
    ) -> AsyncIterator[tuple[str, Any]]:
        """The stream's items, ``(kind, value)`` (see ``actor.RayWorker.generate``)."""
        ...

    def cancel(self) -> None:
        """The stream is being aborted: stop what only this side can stop."""
        ...

    def closed(self, rid: int) -> None:
        """The stream is over on this side."""
        ...


class RayProducer(Producer):
    def __init__(
        self,
        roster: Roster,
        supervisor: Supervisor,
        feed: StreamFeed,
        req: GenerateRequest,
        channel: Channel,
        on_start: Callable[[], None] | None = None,
        deadline_at: float | None = None,
    ) -> None:
        self.roster = roster
        self.supervisor = supervisor
        self.feed = feed
        self.channel = channel
        # Loop time; once aborted, a stream still running ``hang_grace_s`` past it is hung
        # (``Supervisor.watch_stream``). None: not watched (a Serve deployment's streams).
        self.deadline_at = deadline_at
        self.worker: RayWorkerHandle | None = None
        self.instance = ""  # the start of the worker's actor that runs this stream
        self.rid = next(roster.ids)
        self.aborted = False
        self.credit = 0
        self.window = max(channel.capacity, STREAM_WINDOW)
        # Pieces received beyond what the channel holds, and the end of the stream (an
        # error or None, the result) once it arrived behind them.
        self.backlog: deque[Any] = deque()
        self.end: tuple[BaseException | None, Any] | None = None
        self.linked: LinkStream | None = None  # the stream runs on the actor's link
        self.task = asyncio.get_running_loop().create_task(self._run(req, on_start))
        roster.streams.add(self)
        self.task.add_done_callback(lambda _: roster.streams.discard(self))

    def lose(self, err: errors.ZeroserveError) -> None:
        """The cluster is gone: cut the stream with ``err`` and stop waiting for Ray."""
        self.aborted = True
        self.backlog.clear()
        if not self.channel.closed:
            self.channel.abort(err)
        if self.linked is not None:
            self.linked.abort()
        self.task.cancel()

    def _return_credit(self, n: int) -> None:
        if self.worker is None or self.aborted or self.end is not None:
            return
        self.credit += n
        if self.credit >= self.window // 2:
            self.feed.control(self.worker).credit.remote(self.rid, self.credit)
            self.credit = 0

    def _taken(self, n: int) -> None:
        """The consumer took ``n`` pieces (``block``): refill the channel from the
        backlog, then return the credit."""
        if self.backlog or self.end is not None:
            self._flush()
        self._return_credit(n)

    def _flush(self) -> None:
        channel, backlog = self.channel, self.backlog
        while backlog:
            try:
                channel.send_nowait(backlog[0])
            except WouldBlock:
                return
            except errors.ZeroserveError:
                backlog.clear()
                self.abort()  # the consumer went away
                return
            backlog.popleft()
        if self.end is not None and not channel.closed:
            err, result = self.end
            channel.close(err, result=result)

    def _finish(self, err: BaseException | None, result: Any = None) -> None:
        """The actor's stream ended: close the channel behind the backlog."""
        self.end = (err, result)
        if not self.backlog:
            self.channel.close(err, result=result)

    async def _run(self, req: GenerateRequest, on_start: Callable[[], None] | None) -> None:
        channel = self.channel
        leases: list[Lease] = []
        w: RayWorkerHandle | None = None
        try:
            picked = await self.roster.pick(stream=True)
            if on_start is not None:  # an actor takes it: the queue wait is over
                on_start()
            if picked.link is not None:  # the worker protocol, as a process worker's
                self.linked = picked.link.start_stream(req, channel, self.deadline_at)
                return
            w = picked
            self.worker, self.instance = w, w.instance
            w.outstanding += 1
            if channel.policy == "block":
                channel.on_take = self._taken
            async for kind, value in self.feed.items(w, self.rid, req, self.window, leases):
                if kind == "e":
                    self._finish(None, value)
                    return
                if kind == "f":
                    self._finish(rebuild(a.Failed(*value)))
                    return
                if self.aborted:
                    continue
                for _, piece in value if kind == "m" else [(kind, value)]:
                    if not self._send(piece):
                        break
            if not channel.closed and not self.aborted and self.end is None:
                channel.close(WorkerError("the actor's stream ended without a result"))
        except asyncio.CancelledError:
            raise
        except BaseException as exc:  # delivered through the channel, not the task
            err = self.supervisor.failure(w, exc) if w is not None else exc
            if not channel.closed:
                channel.abort(err) if isinstance(err, errors.ZeroserveError) else channel.close(err)
        finally:
            for lease in leases:
                lease.release()
            if w is not None:
                w.outstanding -= 1
                self.feed.closed(self.rid)

    def _send(self, piece: Any) -> bool:
        """Pass one piece on (into the backlog while the channel is full); False once the
        stream is given up."""
        channel, backlog = self.channel, self.backlog
        try:
            if backlog:
                raise WouldBlock
            channel.send_nowait(piece)
        except WouldBlock:
            if len(backlog) >= self.window:
                self.abort()
                channel.abort(WorkerError("actor sent a piece beyond its credit"))
                return False
            backlog.append(piece)
            return True
        except errors.ZeroserveError:
            self.abort()  # consumer gone, or the coalesce cap passed
            return False
        if channel.policy == "coalesce":
            self._return_credit(1)
        return True

    def abort(self) -> None:
        if self.aborted:
            return
        self.feed.cancel()
        self.aborted = True
        if self.linked is not None:
            self.linked.abort()  # the link watches it for hanging, as for any call
            return
        w = self.worker
        if w is None:
            self.task.cancel()
            return
        if w.ready:
            self.feed.control(w).abort.remote(self.rid)
        self.supervisor.watch_stream(self)
