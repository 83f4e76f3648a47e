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

The application hears of every change through one ``ModelListener`` (its backend table):
``model_loaded`` once the engine serves a model (a listener that refuses it fails the
load, and the engine unloads it), ``model_unloaded`` once the engine has stopped it. Idle
models are unloaded by a timer on the engine's clock (``start_idle_timer``), so tests
move a ``ManualClock`` instead of sleeping. A model whose load failed is not retried by
``ensure`` (the autoload path) for ``FAILED_RETRY_S``: its callers get the reason at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import math
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from .. import metrics
from ..errors import ModelLoadError, ModelNotFound, RequestError, SpecError
from ..models.catalog import CatalogEntry
from ..models.loader import ModelRef
from .admission import DEFAULT_RETRY_AFTER_S
from .clock import Timer, call_at
from .engine import Engine
from .load_reasons import public_reason
from .model_eviction import RoomKeeping
from .model_memory import LoadMeter
from .model_pulls import PullGate, dropped_at_rescan, refuse_pulls, resolve_entry
from .model_replace import EntryVersion, ReplaceListener, entry_version, replace
from .model_room import Room, RoomStatistics
from .model_state import ModelState, ModelStateMachine, ModelStateSnapshot
from .options import ModelConfig

# How long a model stays loaded with nothing in flight and no stream open: Ollama's
# ``keep_alive`` default (5 minutes), long enough for a conversation's next turn.
DEFAULT_KEEP_ALIVE_S = 300.0
# How often the idle timer looks for models past their keep_alive: an idle model is
# unloaded at most this long after its keep_alive ends. One pass is a walk over the
# catalog's states, so a second costs nothing measurable.
IDLE_CHECK_S = 1.0
# After a failed load, how long ``ensure`` (a request's autoload) answers with that
# failure instead of loading again: a corrupt file is not reread for every request. An
# explicit ``load`` (the admin's) always tries again.
FAILED_RETRY_S = 10.0

log = logging.getLogger("zeroserve")


class ModelListener(ReplaceListener, Protocol):
    """What hears of loads, replaces and unloads (the application's backend table)."""

    def model_loaded(self, name: str) -> None:
        """The engine now serves ``name``; raising fails the load."""

    async def model_unloaded(self, name: str) -> None:
        """The engine no longer serves ``name`` (its admitted work has finished)."""


@dataclass(frozen=True, slots=True)
class ModelManagerStatistics:
    """One model's life at run time: ``loaded`` (1 or 0, a gauge), the counts since start,
    and the last successful load's duration. Exported as ``zeroserve_model_<field>``
    (counters ``*_total``) with ``name=<model>``; every load's duration is also the
    histogram ``zeroserve_model_load_seconds``."""

    loaded: int = 0
    loads: int = 0  # loads that succeeded
    failed_loads: int = 0
    unloads: int = 0
    evictions: int = 0  # unloads to make room under models_max / models_memory
    load_seconds: float = 0.0  # the last successful load's duration
    memory_bytes: int = 0  # what the model counts against --models-memory while loaded


def config_for(ref: ModelRef) -> ModelConfig:
    """The engine's config for a parsed spec (imports the model's class)."""
    return ModelConfig(name=ref.name, factory=ref.load_class(), options=ref.options, **ref.runtime)


class _Counts:
    """One model's counts, bumped in place (``statistics`` snapshots them)."""

    __slots__ = ("evictions", "failed_loads", "load_seconds", "loads", "unloads")

    def __init__(self) -> None:
        self.loads = self.failed_loads = self.unloads = self.evictions = 0
        self.load_seconds = 0.0


class ModelManager(RoomKeeping):
    """Catalog entries, their states, and the loads and unloads that move them."""

    def __init__(
        self,
        engine: Engine,
        catalog: Mapping[str, CatalogEntry],
        *,
        loaded: Iterable[str] = (),
        keep_alive_s: float = DEFAULT_KEEP_ALIVE_S,
        models_max: int | None = None,
        listener: ModelListener | None = None,
        source: Callable[[], Mapping[str, CatalogEntry]] | None = None,
        models_memory: int | None = None,
        pull: Callable[[str], Path] | None = None,
    ) -> None:
        """``loaded`` names the entries the engine started with; ``keep_alive_s`` is how
        long an unpinned model may stay idle before ``unload_idle`` unloads it;
        ``models_max`` caps the models loaded (or loading) at once: a load over it first
        unloads the least recently used idle, unpinned model; ``listener`` hears of every
        load and unload; ``source`` rebuilds the catalog for ``refresh`` (a rescan);
        ``models_memory`` caps the bytes the loaded models count (``model_room.Room``);
        ``pull`` fetches an entry's pull ``source`` into the cache (blocking: run in a
        thread); None (no ``--allow-pull``) leaves such an entry ``failed``.
        A load that does not fit and finds no idle, unpinned model to unload waits for
        room (``_make_room``)."""
        if not keep_alive_s >= 0:
            raise ValueError(f"keep_alive_s must be >= 0 seconds, not {keep_alive_s!r}")
        if models_max is not None and models_max < 1:
            raise ValueError(f"models_max must be at least 1, not {models_max!r}")
        self._engine = engine
        self._keep_alive_s = keep_alive_s
        self._models_max = models_max
        self.room = Room(models_max, models_memory, engine.worker_pids)
        engine.idle_listener = self._went_idle
        self._asked: dict[str, float] = {}  # name -> longest keep_alive asked while busy
        self._idle_keep: dict[str, float] = {}  # name -> keep_alive of this idle period
        self._callers: dict[str, int] = {}  # name -> callers awaiting its load
        self._room_wait: set[str] = set()  # loads waiting for room now
        self._engine_loads: set[str] = set()  # loads the engine runs now (not dropped)
        self.evictions = 0  # models unloaded to make room under models_max
        self.listener = listener
        self._source = source
        self.pulls = PullGate(pull) if pull is not None else None
        self._added: set[str] = set()  # entries added by ``add`` (pulled): kept by rescans
        self._counts: dict[str, _Counts] = {}
        self._failed_at: dict[str, tuple[float, str]] = {}  # name -> (when, cause)
        self._timer: Timer | None = None
        self._reaping: asyncio.Task[None] | None = None
        self._entries = dict(catalog)
        self._machines = {name: ModelStateMachine() for name in self._entries}
        self._locks: dict[str, asyncio.Lock] = {}
        self._loads: dict[str, asyncio.Task[None]] = {}
        # What each loaded model was loaded from, and the old versions of replaced
        # models still finishing their work (runtime/model_replace.py).
        self._versions: dict[str, EntryVersion] = {}
        self._replacing: set[str] = set()
        self._retiring: dict[str, asyncio.Task[None]] = {}
        for name in loaded:
            machine = self._machine(name)
            machine.to(ModelState.LOADING)
            machine.to(ModelState.LOADED)
            # Loaded before the manager: its workers' RSS if it has any, else its estimate.
            self.room.counted[name] = self.room.measure(name, 0, engine.worker_pids(name)) or (
                self.room.need(self._entries[name]) if models_memory is not None else 0
            )
            self._versions[name] = entry_version(self._entries[name])
        refuse_pulls(self._entries, self._machines, self.pulls)

    # -- queries ---------------------------------------------------------------------------
    def entries(self) -> dict[str, CatalogEntry]:
        return dict(self._entries)

    def status(self, name: str) -> ModelStateSnapshot:
        return self._snapshot(name, self._machine(name))

    def statuses(self) -> dict[str, ModelStateSnapshot]:
        return {name: self._snapshot(name, m) for name, m in self._machines.items()}

    def _snapshot(self, name: str, machine: ModelStateMachine) -> ModelStateSnapshot:
        if machine.state is not ModelState.LOADED:
            return machine.status
        replacing, fault = name in self._replacing, self._engine.fault(name)
        return dataclasses.replace(machine.status, replacing=replacing, fault=fault)

    def statistics(self) -> dict[str, ModelManagerStatistics]:
        """Loads, failures, unloads and evictions by model (an immutable snapshot)."""
        out: dict[str, ModelManagerStatistics] = {}
        for name, machine in self._machines.items():
            counts = self._counts.get(name) or _Counts()
            out[name] = ModelManagerStatistics(
                loaded=int(machine.state is ModelState.LOADED),
                loads=counts.loads,
                failed_loads=counts.failed_loads,
                unloads=counts.unloads,
                evictions=counts.evictions,
                load_seconds=counts.load_seconds,
                memory_bytes=self.room.count(name) if machine.state is ModelState.LOADED else 0,
            )
        return out

    def memory(self) -> RoomStatistics:
        """The loaded models' bytes against ``models_memory`` (0: no cap)."""
        return self.room.statistics()

    def can_pull(self) -> bool:
        """Whether this server may fetch a pull source (``--allow-pull``)."""
        return self.pulls is not None

    def add(self, entry: CatalogEntry) -> None:
        """Add (or change) an entry outside the catalog's source (a pull through the API);
        it starts ``unloaded``, and rescans keep it while its file is there. A name the
        source gives is refused (``SpecError`` naming both origins)."""
        old = self._entries.get(entry.name)
        if old is not None and entry.name not in self._added:
            raise SpecError(
                f"model {entry.name!r} is named twice: by {old.origin} and by {entry.origin}"
            )
        self._added.add(entry.name)
        self._entries[entry.name] = entry
        self._machines.setdefault(entry.name, ModelStateMachine())

    def can_refresh(self) -> bool:
        return self._source is not None

    async def refresh(self) -> tuple[list[str], list[str]]:
        """Rebuild the catalog from its source (a rescan of ``--models-dir``) and take it
        (``rescan``). Raises the source's error (``SpecError``), the catalog unchanged."""
        if self._source is None:
            raise RuntimeError("this manager has no catalog source to rescan")
        return await self.rescan(self._source())

    # -- operations ------------------------------------------------------------------------
    async def rescan(self, catalog: Mapping[str, CatalogEntry]) -> tuple[list[str], list[str]]:
        """Take a fresh catalog (a rescanned models dir). New entries start ``unloaded``; an
        entry that is gone is unloaded first (its admitted work finishes) and then leaves;
        a changed entry is used by its next load. Returns ``(added, removed)`` names."""
        added = [name for name in catalog if name not in self._entries]
        removed = dropped_at_rescan(self._entries, catalog, self._added)
        for name in removed:
            await self.unload(name)
            task = self._loads.get(name)
            async with self._lock(name):
                if task is not None or self._machines[name].state is not ModelState.UNLOADED:
                    continue  # loaded again meanwhile: it stays until a later rescan
                del self._entries[name], self._machines[name], self._locks[name]
        for name, entry in catalog.items():
            self._added.discard(name)  # the source names it now: the source's entry wins
            self._entries[name] = entry
            self._machines.setdefault(name, ModelStateMachine())
        refuse_pulls(catalog, self._machines, self.pulls)
        return added, removed

    async def load(self, name: str, timeout: float | None = None, *, replace: bool = True) -> None:
        """Load ``name`` unless loaded; join the load already running, if any.

        A loaded model whose catalog entry changed since its load (``entry_version``) is
        replaced when ``replace`` (runtime/model_replace.py): this returns once the new
        version serves, the old one finishing its work behind; if the new one fails,
        the old one serves on and this raises. An unchanged loaded model: nothing to do.

        Raises ``ModelLoadError`` (or ``SpecError``) with the load's reason; the model is
        then ``failed`` and a later call tries again. ``timeout`` bounds this caller's
        wait (``TimeoutError``); the load itself goes on for the others.
        """
        entry = self._entry(name)
        task = self._loads.get(name)
        if task is None:
            if self._machine(name).state is ModelState.LOADED:
                if not replace or self._versions.get(name) == entry_version(entry):
                    return
                task = asyncio.ensure_future(self._replace(entry))
            else:
                task = asyncio.ensure_future(self._load(entry))
            self._loads[name] = task
            task.add_done_callback(self._load_done(name))
        await self._await_load(name, task, timeout)

    async def ensure(self, name: str, timeout: float | None = None) -> None:
        """``load`` for a request (autoload): a model whose load failed less than
        ``FAILED_RETRY_S`` ago raises that failure again at once instead of loading."""
        failed = self._failed_at.get(name)
        if (
            self.status(name).state is ModelState.FAILED
            and failed is not None
            and self._engine.clock() - failed[0] < FAILED_RETRY_S
            and name not in self._loads
        ):
            raise ModelLoadError(name, failed[1])
        await self.load(name, timeout, replace=False)

    @property
    def default_wait_s(self) -> float:
        """How long a load without a request's own deadline (an admin's) may wait: the
        server's request deadline."""
        return self._engine.options.default_deadline_s

    def retry_after(self, name: str) -> float:
        """Seconds until ``ensure`` tries a failed model again (at least 1)."""
        failed = self._failed_at.get(name)
        if failed is None:
            return DEFAULT_RETRY_AFTER_S
        return max(1.0, FAILED_RETRY_S - (self._engine.clock() - failed[0]))

    async def unload(self, name: str) -> None:
        """Unload ``name`` once its admitted work has finished; a model not loaded stays so
        (a failed one becomes ``unloaded``). A load in progress is waited for first."""
        self._entry(name)
        task = self._loads.get(name)
        if task is not None:
            await asyncio.wait([task])  # its outcome is its callers'; never cancelled here
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

    def start(self, every_s: float = IDLE_CHECK_S) -> None:
        """Publish the per-model metrics and run ``unload_idle`` every ``every_s`` seconds
        of the engine's clock until ``aclose`` (on a ``ManualClock``: as a test advances
        it)."""
        metrics.register_source(
            "model",
            self.statistics,
            counters=("loads", "failed_loads", "unloads", "evictions"),
            names={"load_seconds": "last_load_seconds"},
        )
        metrics.register_source(
            "models_memory", self.memory, names={"used": "used_bytes", "cap": "cap_bytes"}
        )
        if not every_s > 0:
            raise ValueError(f"the idle check period must be > 0 seconds, not {every_s!r}")

        def tick() -> None:
            if self._reaping is None or self._reaping.done():
                self._reaping = asyncio.ensure_future(self._reap())
            self._timer = call_at(self._engine.clock, self._engine.clock() + every_s, tick)

        self._timer = call_at(self._engine.clock, self._engine.clock() + every_s, tick)

    async def aclose(self) -> None:
        """Stop the idle timer and the metrics (the engine's own close stops the models)."""
        metrics.unregister_source("model")
        metrics.unregister_source("models_memory")
        for task in list(self._retiring.values()):
            task.cancel()  # the old versions stop now, as the engine's close stops all
            with contextlib.suppress(asyncio.CancelledError):
                await task
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        reaping, self._reaping = self._reaping, None
        if reaping is not None and not reaping.done():
            reaping.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await reaping

    # -- internals -------------------------------------------------------------------------
    async def _reap(self) -> None:
        try:
            done = await self.unload_idle()
        except Exception:  # one model's failed unload must not stop the timer
            log.exception("unloading idle models failed")
            return
        if done:
            log.info("unloaded idle model(s): %s", ", ".join(done))

    def _counts_of(self, name: str) -> _Counts:
        counts = self._counts.get(name)
        if counts is None:
            counts = self._counts[name] = _Counts()
        return counts

    def _expired(self, name: str) -> bool:
        if self._machines[name].state is not ModelState.LOADED or self._entries[name].pin:
            return False
        since = self._engine.idle_since(name)
        keep = self._idle_keep.get(name, self._keep_alive_s)
        return since is not None and self._engine.clock() - since >= keep

    def ask_keep_alive(self, name: str, seconds: float) -> None:
        """A request for ``name`` asks that it stay loaded ``seconds`` once idle (``inf``:
        until unloaded by hand). The idle period that follows the model's busy period uses
        the longest keep_alive its requests asked (none asked: ``keep_alive_s``).
        ``RequestError`` (400) for a pinned model: it stays loaded whatever is asked. A
        name not in the catalog is left to the request's own 404."""
        entry = self._entries.get(name)
        if entry is None:
            return
        if entry.pin:
            raise RequestError(
                f"model {name!r} is pinned (a --model, or pin = true): it stays loaded, "
                "whatever keep_alive asks",
                param="keep_alive",
            )
        seconds = math.inf if seconds < 0 else seconds  # Ollama: negative is forever
        self._asked[name] = max(self._asked.get(name, seconds), seconds)

    def _went_idle(self, name: str) -> None:
        """The engine's idle listener: room may have come, and ``name``'s idle period
        takes the keep_alive its busy period asked for (0: unloaded at once)."""
        self.room.wake()
        asked = self._asked.pop(name, None)
        if asked is None:
            self._idle_keep.pop(name, None)
            return
        self._idle_keep[name] = asked
        idle_reap = self._reaping is None or self._reaping.done()
        if asked == 0 and self._timer is not None and idle_reap:
            self._reaping = asyncio.ensure_future(self._reap())

    async def _evict(self, victim: str) -> None:
        async with self._lock(victim):
            if self._machines[victim].state is ModelState.LOADED:
                await self._unload_locked(victim)
                self.evictions += 1
                self._counts_of(victim).evictions += 1

    async def _unload_locked(self, name: str) -> None:
        machine = self._machines[name]
        machine.to(ModelState.UNLOADING)
        try:
            await self._engine.unload(name)
        finally:
            machine.to(ModelState.UNLOADED)
            self._counts_of(name).unloads += 1
            self.room.counted.pop(name, None)
            self._idle_keep.pop(name, None)
            self.room.wake()
        if self.listener is not None:
            await self.listener.model_unloaded(name)
        await self.wait_retired(name)

    # -- replace (runtime/model_replace.py) ----------------------------------------------
    async def wait_retired(self, name: str) -> None:
        """Return once the old version of a replaced ``name`` (if any) has stopped."""
        task = self._retiring.get(name)
        if task is not None:
            with contextlib.suppress(Exception):
                await asyncio.shield(task)

    async def _replace(self, entry: CatalogEntry) -> None:
        name = entry.name
        async with self._lock(name):
            if self._machine(name).state is ModelState.LOADED:
                await self._replace_locked(entry)
                return
        await self._load(entry)  # unloaded meanwhile: a plain load

    async def _replace_locked(self, entry: CatalogEntry) -> None:
        name = entry.name
        await self.wait_retired(name)  # never a third version at once
        version = entry_version(entry)
        if self._versions.get(name) == version:
            return
        self._replacing.add(name)
        started = time.monotonic()
        try:
            retire = await replace(self._engine, name, config_for(entry.ref), self.listener)
        except BaseException as exc:
            self._replacing.discard(name)
            self._counts_of(name).failed_loads += 1
            log.warning("model %r: its new version did not load, the old one serves: %s", name, exc)
            raise
        self._versions[name] = version
        self._record_load(name, time.monotonic() - started)
        task = self._retiring[name] = asyncio.ensure_future(retire())
        task.add_done_callback(self._retired(name))

    def _retired(self, name: str) -> Callable[[asyncio.Task[None]], None]:
        def done(task: asyncio.Task[None]) -> None:
            if self._retiring.get(name) is task:
                del self._retiring[name]
                self._replacing.discard(name)
            if not task.cancelled() and task.exception() is not None:
                log.error(
                    "model %r: stopping its old version failed", name, exc_info=task.exception()
                )

        return done

    async def _load(self, entry: CatalogEntry) -> None:
        name = entry.name
        async with self._lock(name):
            machine = self._machine(name)
            if machine.state is ModelState.LOADED:
                return
            need = self.room.need(entry) if self.room.models_memory is not None else 0
            await self._make_room(name, need)
            machine.to(ModelState.LOADING)  # no await since the room was checked
            self.room.counted[name] = need  # reserved while it loads
            self._engine_loads.add(name)
            version = entry_version(entry)  # before the load reads the file
            started = time.monotonic()  # a duration for the metric, not the engine clock
            meter = LoadMeter()
            try:
                if self.room.too_big(need):
                    raise ModelLoadError(
                        name,
                        f"it needs about {need} bytes, more than --models-memory "
                        f"({self.room.models_memory}) allows for all models together",
                    )
                resolved = await resolve_entry(entry, self.pulls)
                await self._engine.load(name, config_for(resolved.ref))
                cost = self.room.measure(name, meter.grown(), self._engine.worker_pids(name))
                await self._announce(name)
            except Exception as exc:
                self._engine_loads.discard(name)
                self.room.counted.pop(name, None)
                self.room.wake()
                full = exc.cause if isinstance(exc, ModelLoadError) else str(exc)
                log.warning("model %r failed to load: %s", name, full)
                cause = public_reason(full)  # the client's: no server path
                machine.to(ModelState.FAILED, f"model {name!r} failed to load: {cause}")
                self._failed_at[name] = (self._engine.clock(), cause)
                self._counts_of(name).failed_loads += 1
                raise ModelLoadError(name, cause) from None
            except BaseException:
                self._engine_loads.discard(name)
                self.room.counted.pop(name, None)
                self.room.wake()
                machine.to(ModelState.FAILED, "the load was cancelled")
                self._failed_at[name] = (self._engine.clock(), "the load was cancelled")
                self._counts_of(name).failed_loads += 1
                raise
            self._engine_loads.discard(name)
            machine.to(ModelState.LOADED)
            self.room.measured[name] = cost
            self.room.counted[name] = cost or need
            self._failed_at.pop(name, None)
            self._versions[name] = version
            self._record_load(name, time.monotonic() - started)
        await self._shed(name)

    def _record_load(self, name: str, took: float) -> None:
        counts = self._counts_of(name)
        counts.loads += 1
        counts.load_seconds = took
        metrics.MODEL_LOAD_SECONDS.labels(name).observe(took)

    async def _announce(self, name: str) -> None:
        """Tell the listener; if it refuses the model, the engine stops serving it."""
        if self.listener is None:
            return
        try:
            self.listener.model_loaded(name)
        except Exception as exc:
            await self._engine.unload(name)
            raise ModelLoadError(name, f"{type(exc).__name__}: {exc}") from exc

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
