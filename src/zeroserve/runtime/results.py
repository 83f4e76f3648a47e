"""What an executor hands back to the runtime: one request's outputs
(:class:`InferResult`) and its workers' statistics (:class:`WorkerStatistics`). Every
executor returns them; the public names are re-exported from ``zeroserve.runtime``.

Invariant: an ``InferResult``'s leases are released once, by whoever sent (or dropped)
its outputs; releasing it again is a no-op.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .arena import Lease


@dataclass(slots=True)
class InferResult:
    """One request's outputs. ``leases`` keep the outputs' shared memory alive: release
    each once the response has been sent (or the outputs are no longer needed)."""

    outputs: dict[str, Any]
    leases: list[Lease] = field(default_factory=list)

    def release(self) -> None:
        leases, self.leases = self.leases, []
        for lease in leases:
            lease.release()


@dataclass(frozen=True, slots=True)
class WorkerStatistics:
    executor: str
    workers: int
    ready: int
    busy: int
    streams: int
    restarts: int
    crashes: int
    # Slots held by calls that outlived their deadline by the hang grace (thread), and
    # hung workers killed and restarted (process); see docs/architecture.md, "Hung work".
    stuck: int = 0
    reclaimed: int = 0
    # Ray actors on the ingress's node reached through a link (the worker protocol over a
    # socket) rather than a Ray call per batch (docs/architecture.md, "Executors: ray").
    linked: int = 0
