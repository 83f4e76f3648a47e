"""Room for one more model under the caps (docs/models.md, "Memory", "When there is no room").

``Room`` keeps what the model manager needs to decide whether a load fits: the two caps
(``--models-max``, models at once; ``--models-memory``, bytes), the bytes each loaded
(or loading) model counts, and the loads waiting for room. A model counts its measured
cost (``model_memory.LoadMeter``) once loaded; while it loads, the cost it is expected
to have (``need``: its last measured cost, else its estimate). A load that does not fit
and finds nothing to evict (every other model busy or pinned) ``wait``s until ``wake``:
a model went idle, was unloaded, or a load ended
(docs/decisions/0040-model-memory-measured-and-loads-wait-for-room.md).

A loaded model's worker processes may change after its load: a process worker or an
engine's child that died is started again. ``follow`` measures such a model again once
its new processes serve (as many as were measured, or more), so what it counts is the
processes that hold it now, not ones gone (docs/models.md, "Memory").
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from ..models.catalog import CatalogEntry
from .model_memory import estimate_bytes, pids_rss


@dataclass(frozen=True, slots=True)
class RoomStatistics:
    """The loaded set's memory against its cap, exported as
    ``zeroserve_models_memory_used_bytes`` and ``zeroserve_models_memory_cap_bytes`` (0:
    no cap), and the loads waiting for room now (``zeroserve_models_memory_waiting``)."""

    used: int
    cap: int
    waiting: int


class Room:
    """The caps, each model's counted bytes, and the loads waiting for room."""

    def __init__(
        self,
        models_max: int | None,
        models_memory: int | None,
        pids: Callable[[str], list[int]] | None = None,
    ) -> None:
        """``pids(name)``: the processes holding loaded model ``name`` now (``KeyError``
        when it is not loaded), for ``follow``."""
        if models_memory is not None and models_memory < 1:
            raise ValueError(f"models_memory must be at least 1 byte, not {models_memory!r}")
        self.models_max = models_max
        self.models_memory = models_memory
        self.counted: dict[str, int] = {}  # loaded or loading model -> bytes it counts
        self.measured: dict[str, int] = {}  # model -> its last load's measured cost
        self._waiters: list[asyncio.Future[None]] = []
        self._pids = pids
        # loaded model -> the server's RSS growth across its load, and the processes
        # measured with it
        self._workers: dict[str, tuple[int, tuple[int, ...]]] = {}

    def measure(self, name: str, grown: int, pids: list[int]) -> int:
        """What loaded ``name`` costs now: ``grown`` (the server's RSS growth across its
        load) plus the RSS of ``pids``, its processes; remembered for ``follow``."""
        self._workers[name] = (grown, tuple(pids))
        return grown + pids_rss(pids)

    def follow(self) -> None:
        """Measure again every loaded model whose processes changed since they were
        measured, once as many serve as then: its load's growth plus their RSS (counted
        and remembered as its last measured cost). While fewer serve (a worker or child
        being started again) it keeps what it counted."""
        if self._pids is None:
            return
        for name, (grown, measured) in list(self._workers.items()):
            if name not in self.counted:
                del self._workers[name]  # unloaded
                continue
            try:
                now = tuple(self._pids(name))
            except KeyError:
                continue  # loading again: its load measures it
            if now != measured and len(now) >= len(measured):
                self.counted[name] = self.measured[name] = self.measure(name, grown, list(now))

    def count(self, name: str) -> int:
        """Bytes ``name`` counts now (``follow`` first)."""
        self.follow()
        return self.counted.get(name, 0)

    def need(self, entry: CatalogEntry) -> int:
        """The bytes ``entry`` is expected to take: its last measured cost, else its
        estimate (a GGUF's; 0 when unknown)."""
        known = self.measured.get(entry.name)
        return known if known is not None else estimate_bytes(entry)

    def used(self, names: Iterable[str] | None = None) -> int:
        """Bytes counted by ``names`` (every model by default; ``follow`` first)."""
        self.follow()
        if names is None:
            return sum(self.counted.values())
        return sum(self.counted.get(n, 0) for n in names)

    def too_big(self, need: int) -> bool:
        """Whether ``need`` bytes exceed the memory cap on their own (never fits)."""
        return self.models_memory is not None and need > self.models_memory

    def fits(self, held: list[str], need: int) -> bool:
        """Whether one more model of ``need`` bytes fits beside the models ``held``."""
        if self.models_max is not None and len(held) >= self.models_max:
            return False
        return self.models_memory is None or self.used(held) + need <= self.models_memory

    def capped(self) -> bool:
        return self.models_max is not None or self.models_memory is not None

    async def wait(self) -> None:
        """Return at the next ``wake`` (cancellable)."""
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append(fut)
        try:
            await fut
        finally:
            if fut in self._waiters:
                self._waiters.remove(fut)

    def wake(self, _: str | None = None) -> None:
        """Room may have come (a model went idle, was unloaded, or a load ended): every
        waiting load looks again."""
        if not self._waiters:
            return  # the common case: called at the end of every request
        waiters, self._waiters = self._waiters, []
        for fut in waiters:
            if not fut.done():
                fut.set_result(None)

    def statistics(self) -> RoomStatistics:
        return RoomStatistics(
            used=self.used(), cap=self.models_memory or 0, waiting=len(self._waiters)
        )
