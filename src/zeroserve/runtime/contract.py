"""The executor contract: ``Executor``, what runs one model's work, and ``Producer``, one
running generation. Every executor implements them: the inline and thread executors
(``inproc.py``), process workers and Ray actors.

Its own module, kept interpreted: the process and Ray executors are not compiled, and an
interpreted class cannot subclass a compiled one
(docs/decisions/0007-compiled-build.md)."""

from __future__ import annotations

import abc
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from ..errors import WorkerError, ZeroserveError
from ..models.base import GenerateRequest
from .arena import Arena
from .channel import Channel
from .classes import Priority
from .options import ResolvedModel
from .results import InferResult, WorkerStatistics

# The ``Retry-After`` of a model whose workers are being restarted: a respawn takes about
# a model's load time, and a client retrying each second finds it back soon after.
RESTART_RETRY_AFTER_S = 1.0


def restarting(message: str) -> WorkerError:
    """The 503 (``worker_failed``, ``Retry-After``) admission answers while no worker of
    a model can take work because they are being restarted (crashed, or killed for hung
    work: docs/decisions/0025-abandoned-work-grace-starts-at-abandonment.md)."""
    seconds = max(1, int(RESTART_RETRY_AFTER_S + 0.999))
    return WorkerError(
        message, status=503, headers=[(b"retry-after", str(seconds).encode("ascii"))]
    )


class Producer(abc.ABC):
    """A running generation feeding a channel."""

    @abc.abstractmethod
    def abort(self) -> None:
        """Stop generating as soon as possible (the model's generator is closed)."""


class Executor(abc.ABC):
    """Runs one model's work: batches of infer/embed on slots, and generations."""

    kind: str

    def __init__(self, spec: ResolvedModel, arena: Arena) -> None:
        self.spec = spec
        self.arena = arena

    @abc.abstractmethod
    async def start(self, timeout: float) -> None: ...

    @abc.abstractmethod
    def ready(self) -> bool: ...

    # A slot for a batch of the model's infer or embed batcher, whose best request is of
    # class ``priority`` and waiting since ``arrived`` (the batcher's clock): waits for a
    # slot are served by class with aging (runtime/waiters.py).
    @abc.abstractmethod
    async def acquire(self, priority: Priority, arrived: float) -> Any: ...

    @abc.abstractmethod
    def release(self, slot: Any) -> None: ...

    # ``deadline_at`` (event-loop time): the latest deadline of the requests a call serves.
    # A call still running ``hang_grace_s`` after it is hung: its slot or worker is
    # reclaimed (see docs/architecture.md, "Hung work").
    @abc.abstractmethod
    async def infer(
        self, slot: Any, batch: list[Mapping[str, Any]], *, deadline_at: float | None = None
    ) -> list[InferResult | BaseException]: ...

    @abc.abstractmethod
    async def embed(
        self, slot: Any, texts: list[str], *, deadline_at: float | None = None
    ) -> np.ndarray: ...

    def has_capacity(self) -> bool:
        """Whether a worker or slot can take a new request now or soon: false when every
        one is held by work that outlived its deadline, or is being restarted (admission
        then answers 503 at the head: ``ModelRuntime.refusal``)."""
        return True

    def local_pids(self) -> list[int]:
        """The processes on this machine, besides the server, that hold the model: their
        RSS is what it costs (runtime/model_memory.py). None for a model in this process."""
        return []

    def unavailable(self) -> ZeroserveError | None:
        """Why no new request can run, when the reason is not hung work (workers being
        restarted, the cluster the workers run on gone): the error admission answers with
        while ``has_capacity()`` is false, and the reason ``/ready`` gives; None
        otherwise."""
        return None

    def infer_now(self, inputs: Mapping[str, Any]) -> InferResult | None:
        """Run one request to completion right now, on the calling (loop) thread, when
        this executor can do so without blocking; else None. Only the inline executor
        with a sync ``infer`` can: everything else needs a thread, a worker or an await."""
        return None

    # ``on_start`` (tracing's queue wait, None when off): called once, when a worker or
    # the loop starts the generation.
    @abc.abstractmethod
    def generate(
        self,
        req: GenerateRequest,
        channel: Channel,
        *,
        deadline_at: float | None = None,
        on_start: Callable[[], None] | None = None,
    ) -> Producer: ...

    @abc.abstractmethod
    async def aclose(self) -> None: ...

    @abc.abstractmethod
    def statistics(self) -> WorkerStatistics: ...
