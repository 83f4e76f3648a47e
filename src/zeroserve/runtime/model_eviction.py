"""Room for a model under ``--models-max`` and ``--models-memory``, and the callers that
wait for a load (docs/architecture.md, "Models at run time"): the model manager's
eviction and load-waiting half, a mixin so the manager's module stays one screenful of
states and loads. The manager owns every attribute declared here."""

from __future__ import annotations

import asyncio
import logging

from ..errors import Overloaded
from ..models.catalog import CatalogEntry
from .admission import DEFAULT_RETRY_AFTER_S
from .engine import Engine
from .model_room import Room
from .model_state import ModelState, ModelStateMachine

log = logging.getLogger("zeroserve")


class RoomKeeping:
    """Making room for a load, shedding after one, and bounding the callers of a load."""

    room: Room
    _engine: Engine
    _entries: dict[str, CatalogEntry]
    _machines: dict[str, ModelStateMachine]
    _callers: dict[str, int]
    _room_wait: set[str]
    _engine_loads: set[str]
    _loads: dict[str, asyncio.Task[None]]

    async def _evict(self, victim: str) -> None:
        raise NotImplementedError

    async def _make_room(self, name: str, need: int) -> None:
        """Unload least recently used idle, unpinned models until ``name`` (``need``
        bytes) fits under ``models_max`` and ``models_memory``. With nothing to unload
        (every other model busy or pinned), wait for room: the room is looked at again
        whenever a model goes idle, is unloaded or a load ends (``Room.wake``); the
        callers' own timeouts bound the wait (``_await_load``). Nothing in flight is cut."""
        if not self.room.capped() or self.room.too_big(need):
            return  # too big never fits: the load fails with the reason (``_load``)
        while True:
            held = self._held(name)
            if self.room.fits(held, need):
                return
            count_full = self.room.models_max is not None and len(held) >= self.room.models_max
            victim = self._least_recently_used(held, freeing=not count_full)
            if victim is None:
                self._room_wait.add(name)
                try:
                    await self.room.wait()
                finally:
                    self._room_wait.discard(name)
                continue
            await self._evict(victim)

    def _held(self, name: str) -> list[str]:
        """The models loaded or loading, other than ``name``."""
        busy = (ModelState.LOADED, ModelState.LOADING)
        return [n for n, m in self._machines.items() if m.state in busy and n != name]

    def _least_recently_used(
        self, held: list[str], keep: str = "", *, freeing: bool = False
    ) -> str | None:
        """The loaded, idle, unpinned model of ``held`` idle the longest (not ``keep``;
        ``freeing``: only one that counts bytes, when memory is what is short)."""
        idle = [
            (since, n)
            for n in held
            if n != keep
            and (not freeing or self.room.counted.get(n, 0) > 0)
            and self._machines[n].state is ModelState.LOADED
            and not self._entries[n].pin
            and (since := self._engine.idle_since(n)) is not None
        ]
        return min(idle)[1] if idle else None

    async def _shed(self, name: str) -> None:
        """After ``name`` loaded and measured more than expected: while the models
        together exceed ``models_memory``, unload the least recently used idle, unpinned
        others (those busy stay: the cap is exceeded until they go idle and a later
        load sheds them)."""
        cap = self.room.models_memory
        while cap is not None and self.room.used() > cap:
            victim = self._least_recently_used(self._held(name), keep=name, freeing=True)
            if victim is None:
                log.warning(
                    "models use %d bytes, over --models-memory %d: nothing idle to unload",
                    self.room.used(),
                    cap,
                )
                return
            await self._evict(victim)

    async def _await_load(self, name: str, task: asyncio.Task[None], timeout: float | None) -> None:
        """Await ``task`` (``name``'s shared load) as one of at most the model's queue
        depth callers (more: ``Overloaded(503)`` with ``Retry-After``). A caller whose
        ``timeout`` ends while the load waits for room gets ``Overloaded(503)`` saying so;
        once its last caller has gone, a load the engine has not begun is dropped."""
        waiting = self._callers.get(name, 0)
        limit = self._waiters_max(name)
        if waiting >= limit:
            raise Overloaded(
                f"{waiting} requests already wait for model {name!r} to load (the most, its "
                "queue depth); try again shortly",
                status=503,
                retry_after=DEFAULT_RETRY_AFTER_S,
            )
        self._callers[name] = waiting + 1
        try:
            if timeout is None:
                await asyncio.shield(task)
            else:
                await asyncio.wait_for(asyncio.shield(task), timeout)
        except TimeoutError:
            if name not in self._room_wait:
                raise
            raise Overloaded(
                f"model {name!r} found no room to load in time: every loaded model is busy "
                "or pinned (--models-max / --models-memory); try again shortly",
                status=503,
                retry_after=DEFAULT_RETRY_AFTER_S,
            ) from None
        finally:
            left = self._callers[name] - 1
            if left:
                self._callers[name] = left
            else:
                del self._callers[name]
                if name not in self._engine_loads and self._loads.get(name) is task:
                    del self._loads[name]  # a later caller starts a fresh load
                    task.cancel()

    def _waiters_max(self, name: str) -> int:
        depth = self._entries[name].ref.runtime.get("queue_depth")
        return int(depth if depth is not None else self._engine.options.queue_depth)
