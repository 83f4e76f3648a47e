"""Catalog entries whose file is pulled at their first load (docs/models.md, "Pulling
models"; docs/decisions/0052-pull-route-and-model-toml-sources.md).

An entry with a pull ``source`` (a ``model.toml`` with ``source = "hf:..."``) names the
source as its location until its first load: the manager's load fetches it into the
cache in a thread (the fetch blocks, the event loop does not) and loads the file. A
server without ``--allow-pull`` fetches nothing: such an entry is ``failed`` from the
start, its reason naming the flag.

``PullGate`` bounds the fetches, the load's and the pull route's alike: callers naming
one source share its one fetch, and at most ``MAX_PULLS`` fetch at once (the others
wait their turn). A caller that gives up cancels nothing: the fetch runs on in its
thread, and its file (or its resumable partial download) stays in the cache.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Callable, Mapping, Set
from dataclasses import dataclass
from pathlib import Path

from ..errors import ModelLoadError, ZeroserveError
from ..models.catalog import CatalogEntry
from .model_state import ModelState, ModelStateMachine

# Fetches at once: each is one download that fills the link and the disk, so two share
# them with little loss while a third would only slow the others.
MAX_PULLS = 2

# Why an entry with a pull source is ``failed`` on a server started without the flag.
PULL_REFUSED = (
    "model {name!r} names {src!r} to fetch: start the server with --allow-pull to pull it "
    "at its first load (nothing is fetched without it)"
)


@dataclass(frozen=True, slots=True)
class PullGateStatistics:
    """Fetches running now, and distinct sources waiting for a turn."""

    running: int
    waiting: int


class PullGate:
    """One fetch per source at a time, at most ``max_pulls`` at once, off the loop."""

    def __init__(self, pull: Callable[[str], Path], max_pulls: int = MAX_PULLS) -> None:
        self._pull = pull
        self._turns = asyncio.Semaphore(max_pulls)
        self._fetches: dict[str, asyncio.Task[Path]] = {}
        self._running = 0

    async def fetch(self, source: str) -> Path:
        """The checked file of ``source`` (joining its fetch if one runs); raises what
        the pull raised."""
        task = self._fetches.get(source)
        if task is None:
            task = self._fetches[source] = asyncio.ensure_future(self._fetch(source))
            task.add_done_callback(lambda done: self._done(source, done))
        return await asyncio.shield(task)

    async def _fetch(self, source: str) -> Path:
        async with self._turns:
            self._running += 1
            try:
                return await asyncio.to_thread(self._pull, source)
            finally:
                self._running -= 1

    def _done(self, source: str, task: asyncio.Task[Path]) -> None:
        if self._fetches.get(source) is task:
            del self._fetches[source]
        if not task.cancelled():
            task.exception()  # retrieved: each caller got it through its shield

    def statistics(self) -> PullGateStatistics:
        return PullGateStatistics(self._running, len(self._fetches) - self._running)


def refuse_pulls(
    entries: Mapping[str, CatalogEntry],
    machines: Mapping[str, ModelStateMachine],
    pull: PullGate | None,
) -> None:
    """Without ``pull``, mark each unloaded entry with a pull source ``failed``."""
    if pull is not None:
        return
    for name, entry in entries.items():
        machine = machines[name]
        if entry.source is not None and machine.state is ModelState.UNLOADED:
            machine.to(ModelState.LOADING)
            machine.to(ModelState.FAILED, PULL_REFUSED.format(name=name, src=entry.source))


def dropped_at_rescan(
    entries: Mapping[str, CatalogEntry], found: Mapping[str, CatalogEntry], added: Set[str]
) -> list[str]:
    """The names a rescan drops: entries the source gave and no longer ``found``, and
    entries added by a pull (``added``; a rescan keeps them) whose file is gone (``zeroserve
    rm``, or deleted by hand)."""
    return [
        name
        for name, entry in entries.items()
        if name not in found and (name not in added or _file_gone(entry))
    ]


def _file_gone(entry: CatalogEntry) -> bool:
    location = entry.ref.options.get("location")
    return entry.source is None and isinstance(location, str) and not Path(location).exists()


async def resolve_entry(entry: CatalogEntry, pull: PullGate | None) -> CatalogEntry:
    """``entry`` with its pull source fetched (in a thread) and named as its location.

    Raises:
        ModelLoadError: no ``pull`` (naming the flag), or the pull failed (naming the
            source and why: a wrong pin, the hub's 404, a dropped connection).
    """
    if entry.source is None:
        return entry
    if pull is None:
        raise ModelLoadError(entry.name, PULL_REFUSED.format(name=entry.name, src=entry.source))
    try:
        path = await pull.fetch(entry.source)
    except ZeroserveError as exc:
        raise ModelLoadError(entry.name, f"pulling {entry.source}: {exc.message}") from exc
    except Exception as exc:  # the hub client's own errors: connection, 404, offline
        raise ModelLoadError(
            entry.name, f"pulling {entry.source}: {type(exc).__name__}: {exc}"
        ) from exc
    ref = dataclasses.replace(entry.ref, options={**entry.ref.options, "location": str(path)})
    return dataclasses.replace(entry, ref=ref)
