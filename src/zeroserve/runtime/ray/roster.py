"""A Ray executor's workers as the ingress sees them, and the state its parts share.

Strategy
--------
One :class:`RayWorkerHandle` per Ray actor (or one for a Serve deployment's handle): its
Ray handle, which start of the actor answered last, its link when it has one, its batch
slots and its calls in flight. The :class:`Roster` holds the handles with what the
executor's parts (its fleet, its supervisor, its stream producers) all read: the ids of
calls and streams, the tasks waiting for a worker, whether the executor is closing, and
whether its cluster answers. Routing is here (``pick``): a batch goes to a ready worker
with a free slot, a stream to any ready worker; attached ones first, then the fewest
calls in flight.

Invariants
----------
* Everything here runs on the event-loop thread.
* ``pick`` never returns a worker that is down, hung on a link, or (for a batch) full;
  it raises ``Closed`` once the executor closes and ``ClusterUnavailable`` while the
  cluster is gone, and otherwise waits for a ``notify``.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from ... import errors
from ...errors import ClusterUnavailable
from ..classes import Priority
from ..waiters import Waiters
from ..worker.link import WorkerLink, loop_now
from . import cluster

T = TypeVar("T")

if TYPE_CHECKING:
    from ..arena import Arena
    from ..options import ResolvedModel, RuntimeOptions
    from .placement import Placement

# Batches in flight on one actor (its batch slots). The actor still runs them one at a
# time; the second is there to hide a Ray round trip (submission, the actor's task
# dispatch, the reply through Ray's event loop bridge: about 1.5 ms of CPU on this
# machine's cores, measured with a bare actor) behind the model's work on the first.
# Measured on the 4 MiB echo (8 s runs, each against the process executor measured just
# after): one slot 0.68x its req/s, two 0.78x; four no better than two once the core is
# saturated (docs/architecture.md, "Executors: ray").
PIPELINE_DEPTH = 2


class RayWorkerHandle:
    """This side of one actor: its handle, state and the calls in flight on it."""

    __slots__ = (
        "actor",
        "address",
        "attached",
        "batches",
        "index",
        "instance",
        "link",
        "linkable",
        "node",
        "outstanding",
        "pid",
        "ready",
        "tasks",
    )

    def __init__(self, index: int, actor: Any, *, linkable: bool = True) -> None:
        self.index = index
        self.actor = actor
        # Whether an attached worker is reached through a link (the worker protocol over a
        # socket) rather than a Ray call per batch; a Serve deployment's handle is not.
        self.linkable = linkable
        self.attached = False
        self.pid = 0
        self.instance = ""  # which start of the actor answered its last ``hello``
        self.address = ""  # its link socket ("" when it serves none)
        self.node = ""  # its Ray node's id
        self.link: WorkerLink | None = None  # the open link: every call goes through it
        self.ready = False
        self.batches = 0  # batch slots taken (PIPELINE_DEPTH, or 1 through a link)
        self.outstanding = 0
        self.tasks: set[asyncio.Future[Any]] = set()

    def hello(self, answer: tuple[int, bool, str, str, str]) -> None:
        self.pid, self.attached, self.instance, self.address, self.node = answer

    @property
    def depth(self) -> int:
        """Batches this actor may have in flight: a link's worker runs one at a time and
        costs no round trip to hide; Ray calls are pipelined (``PIPELINE_DEPTH``)."""
        return 1 if self.link is not None else PIPELINE_DEPTH

    def usable(self, now: float | None) -> bool:
        """Ready, and (through a link) not running a call past its deadline."""
        return self.ready and (self.link is None or self.link.usable(now))

    def rank(self) -> tuple[int, int]:
        calls = self.outstanding + (len(self.link.calls) if self.link is not None else 0)
        return (0 if self.attached else 1, calls)


class OpenStream(Protocol):
    """A stream the executor has open: cut when the cluster is lost."""

    def lose(self, err: errors.ZeroserveError) -> None: ...


class Roster:
    """A Ray executor's workers and the state its fleet, supervisor and producers share."""

    def __init__(
        self,
        spec: ResolvedModel,
        arena: Arena,
        options: RuntimeOptions,
        placement: Placement,
    ) -> None:
        self.spec = spec
        self.arena = arena
        self.options = options
        self.placement = placement
        self.handles: list[RayWorkerHandle] = []
        self.ids = itertools.count(1)  # of calls and streams sent to the workers
        self.closing = False
        # Whether the cluster answered the last probe (the supervisor's cluster watch).
        self.cluster_up = True
        self.streams: set[OpenStream] = set()
        self._waiters = Waiters(options.priority_aging_s)

    def notify(self) -> None:
        """Wake the tasks waiting for a worker: each re-checks."""
        self._waiters.wake_all()

    async def wait(self) -> None:
        await self._waiters.wait()

    def unreachable(self) -> ClusterUnavailable:
        return ClusterUnavailable(
            f"the Ray cluster of model {self.spec.name!r} is unreachable",
            retry_after=cluster.RETRY_AFTER_S,
        )

    async def pick(self, *, stream: bool) -> RayWorkerHandle:
        """A worker for a stream (any usable one: a stream takes no slot, so its wait is
        not ordered) or a batch (taking no slot: the caller does; see ``take``)."""
        while True:
            w = self._usable(stream=stream)
            if w is not None:
                return w
            await self.wait()

    async def take(self, attempt: Callable[[], T | None], priority: Priority, arrived: float) -> T:
        """``attempt()``'s slot, waiting by class with the other takers
        (runtime/waiters.py)."""
        return await self._waiters.take(attempt, priority, arrived)

    def batch_worker(self) -> RayWorkerHandle | None:
        """The best worker with room for a batch (None: none); raises when closing or
        the cluster is unreachable."""
        return self._usable(stream=False)

    def _usable(self, *, stream: bool) -> RayWorkerHandle | None:
        if self.closing:
            raise errors.Closed("the engine is shutting down")
        if not self.cluster_up:
            raise self.unreachable()
        now = loop_now()
        ready = [w for w in self.handles if w.usable(now) and (stream or w.batches < w.depth)]
        return min(ready, key=RayWorkerHandle.rank) if ready else None
