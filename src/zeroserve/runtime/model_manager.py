"""The model manager: loads and unloads catalog entries on the engine (docs/architecture.md, "Models at run time").

Strategy
--------
The manager owns one ``ModelStateMachine`` per catalog entry and is the only caller of
``Engine.load`` / ``Engine.unload``. Loads of one model are shared: every caller that asks
while a load runs awaits that same load (under ``asyncio.shield``, so one caller giving up
cancels nothing for the others) and sees its one outcome, success or the failure's
reason. Operations on one model run one at a time under its lock, so a load racing an
unload ends in a state that matches the engine: ``loaded`` exactly when the engine serves
the model.

A load names a catalog entry, never a path from a request; an unknown name is
``ModelNotFound`` naming it (an admin's input, safe to repeat).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Iterable, Mapping

from ..errors import ModelNotFound, Overloaded
from ..models.catalog import CatalogEntry
from ..models.loader import ModelRef
from .admission import DEFAULT_RETRY_AFTER_S
from .engine import Engine
from .model_state import ModelState, ModelStateMachine, ModelStateSnapshot
from .options import ModelConfig

# How long a model stays loaded with nothing in flight and no stream open: Ollama's
# ``keep_alive`` default (5 minutes), long enough for a conversation's next turn.
DEFAULT_KEEP_ALIVE_S = 300.0


def config_for(ref: ModelRef) -> ModelConfig:
    """The engine's config for a parsed spec (imports the model's class)."""
    return ModelConfig(name=ref.name, factory=ref.load_class(), options=ref.options, **ref.runtime)


class ModelManager:
    """Catalog entries, their states, and the loads and unloads that move them."""

    def __init__(
        self,
        engine: Engine,
        catalog: Mapping[str, CatalogEntry],
        *,
        loaded: Iterable[str] = (),
        keep_alive_s: float = DEFAULT_KEEP_ALIVE_S,
        models_max: int | None = None,
    ) -> None:
        """``loaded`` names the entries the engine started with; ``keep_alive_s`` is how
        long an unpinned model may stay idle before ``unload_idle`` unloads it;
        ``models_max`` caps the models loaded (or loading) at once: a load over it first
        unloads the least recently used idle, unpinned model."""
        if not keep_alive_s >= 0:
            raise ValueError(f"keep_alive_s must be >= 0 seconds, not {keep_alive_s!r}")
        if models_max is not None and models_max < 1:
            raise ValueError(f"models_max must be at least 1, not {models_max!r}")
        self._engine = engine
        self._keep_alive_s = keep_alive_s
        self._models_max = models_max
        self.evictions = 0  # models unloaded to make room under models_max
        self._entries = dict(catalog)
        self._machines = {name: ModelStateMachine() for name in self._entries}
        self._locks: dict[str, asyncio.Lock] = {}
        self._loads: dict[str, asyncio.Task[None]] = {}
        for name in loaded:
            machine = self._machine(name)
            machine.to(ModelState.LOADING)
            machine.to(ModelState.LOADED)

    # -- queries ---------------------------------------------------------------------------
    def entries(self) -> dict[str, CatalogEntry]:
        return dict(self._entries)

    def status(self, name: str) -> ModelStateSnapshot:
        return self._machine(name).status

    def statuses(self) -> dict[str, ModelStateSnapshot]:
        return {name: m.status for name, m in self._machines.items()}

    # -- operations ------------------------------------------------------------------------
    async def rescan(self, catalog: Mapping[str, CatalogEntry]) -> tuple[list[str], list[str]]:
        """Take a fresh catalog (a rescanned models dir). New entries start ``unloaded``; an
        entry that is gone is unloaded first (its admitted work finishes) and then leaves;
        a changed entry is used by its next load. Returns ``(added, removed)`` names."""
        added = [name for name in catalog if name not in self._entries]
        removed = [name for name in self._entries if name not in catalog]
        for name in removed:
            await self.unload(name)
            task = self._loads.get(name)
            async with self._lock(name):
                if task is not None or self._machines[name].state is not ModelState.UNLOADED:
                    continue  # loaded again meanwhile: it stays until a later rescan
                del self._entries[name], self._machines[name], self._locks[name]
        for name, entry in catalog.items():
            self._entries[name] = entry
            self._machines.setdefault(name, ModelStateMachine())
        return added, removed

    async def load(self, name: str) -> None:
        """Load ``name`` unless loaded; join the load already running, if any.

        Raises ``ModelLoadError`` (or ``SpecError``) with the load's reason; the model is
        then ``failed`` and a later call tries again.
        """
        entry = self._entry(name)
        task = self._loads.get(name)
        if task is None:
            if self._machine(name).state is ModelState.LOADED:
                return
            task = asyncio.ensure_future(self._load(entry))
            self._loads[name] = task
            task.add_done_callback(self._load_done(name))
        await asyncio.shield(task)

    async def unload(self, name: str) -> None:
        """Unload ``name`` once its admitted work has finished; a model not loaded stays so
        (a failed one becomes ``unloaded``). A load in progress is waited for first."""
        self._entry(name)
        task = self._loads.get(name)
        if task is not None:
            with contextlib.suppress(Exception):
                await asyncio.shield(task)
        async with self._lock(name):
            machine = self._machine(name)
            if machine.state is ModelState.FAILED:
                machine.to(ModelState.UNLOADED)
            elif machine.state is ModelState.LOADED:
                await self._unload_locked(name)

    def idle_models(self) -> list[str]:
        """Loaded, unpinned models idle (nothing in flight, no stream open) for at least
        ``keep_alive_s`` on the engine's clock."""
        return [name for name in self._machines if self._expired(name)]

    async def unload_idle(self) -> list[str]:
        """Unload every model ``idle_models`` names, each checked again under its lock (a
        request that arrived meanwhile keeps it loaded). Returns the names unloaded."""
        done: list[str] = []
        for name in self.idle_models():
            async with self._lock(name):
                if self._expired(name):
                    await self._unload_locked(name)
                    done.append(name)
        return done

    # -- internals -------------------------------------------------------------------------
    def _expired(self, name: str) -> bool:
        if self._machines[name].state is not ModelState.LOADED or self._entries[name].pin:
            return False
        since = self._engine.idle_since(name)
        return since is not None and self._engine.clock() - since >= self._keep_alive_s

    async def _make_room(self, name: str) -> None:
        """Under ``models_max``, unload least recently used idle, unpinned models until
        ``name`` fits; ``Overloaded(503)`` when none can be unloaded."""
        limit = self._models_max
        if limit is None:
            return
        busy = (ModelState.LOADED, ModelState.LOADING)
        while True:
            held = [n for n, m in self._machines.items() if m.state in busy and n != name]
            if len(held) < limit:
                return
            idle = [
                (since, n)
                for n in held
                if self._machines[n].state is ModelState.LOADED
                and not self._entries[n].pin
                and (since := self._engine.idle_since(n)) is not None
            ]
            if not idle:
                raise Overloaded(
                    f"{len(held)} models are loaded (the most at once, --models-max) and none "
                    f"is idle and unpinned; model {name!r} cannot load now",
                    status=503,
                    retry_after=DEFAULT_RETRY_AFTER_S,
                )
            victim = min(idle)[1]
            async with self._lock(victim):
                if self._machines[victim].state is ModelState.LOADED:
                    await self._unload_locked(victim)
                    self.evictions += 1

    async def _unload_locked(self, name: str) -> None:
        machine = self._machines[name]
        machine.to(ModelState.UNLOADING)
        try:
            await self._engine.unload(name)
        finally:
            machine.to(ModelState.UNLOADED)

    async def _load(self, entry: CatalogEntry) -> None:
        name = entry.name
        async with self._lock(name):
            machine = self._machine(name)
            if machine.state is ModelState.LOADED:
                return
            await self._make_room(name)
            machine.to(ModelState.LOADING)  # no await since the room was checked
            try:
                await self._engine.load(name, config_for(entry.ref))
            except Exception as exc:
                machine.to(ModelState.FAILED, str(exc))
                raise
            except BaseException:
                machine.to(ModelState.FAILED, "the load was cancelled")
                raise
            machine.to(ModelState.LOADED)

    def _load_done(self, name: str) -> Callable[[asyncio.Task[None]], None]:
        def done(task: asyncio.Task[None]) -> None:
            if self._loads.get(name) is task:
                del self._loads[name]
            if not task.cancelled():
                task.exception()  # retrieved: each caller got it through its shield

        return done

    def _entry(self, name: str) -> CatalogEntry:
        entry = self._entries.get(name)
        if entry is None:
            raise ModelNotFound(f"model {name!r} is not in the catalog")
        return entry

    def _machine(self, name: str) -> ModelStateMachine:
        self._entry(name)
        return self._machines[name]

    def _lock(self, name: str) -> asyncio.Lock:
        lock = self._locks.get(name)
        if lock is None:
            lock = self._locks[name] = asyncio.Lock()
        return lock
