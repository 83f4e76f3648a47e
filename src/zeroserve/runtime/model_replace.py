"""Replacing a loaded model without dropping anything (docs/architecture.md, "Models at
run time"; docs/models.md, "Replacing a loaded model"; the choices:
docs/decisions/0042-replace-by-entry-version-beside-the-old.md).

Strategy
--------
A catalog entry has a *version*: its spec (target, options, runtime settings) and, for
an entry backed by a file or folder, that path's size, modification time and inode. The
manager remembers the version it loaded; a load of a loaded model whose entry's version
differs (a rescan took an edited ``model.toml``, the GGUF was rewritten in place) is a
replace, and a load whose version is the same does nothing.

A replace is three steps, the first two under the model's lock:

1. ``Engine.load_beside`` starts the new version's workers while the old one serves. If
   it fails the old one serves on, untouched, and the caller gets the reason.
2. ``Engine.switch`` puts the new version in the engine's table and the listener (the
   backend table) builds its backend, in one step with no await between them: a request
   that looks the model up after it gets the new version, one that was admitted before
   holds the old version's ticket.
3. The old version retires in the background: its admission is closed, the requests and
   streams it admitted run to their end (each bounded by its own deadline), then its
   workers stop and its backend is closed.

So two versions exist from the start of step 1 to the end of step 3 and never longer: a
second replace of the same model first waits for the previous old version to retire.
"""

from __future__ import annotations

import os
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Protocol

from ..errors import ModelLoadError
from ..models.catalog import CatalogEntry
from .engine import Engine
from .options import ModelConfig


@dataclass(frozen=True)
class EntryVersion:
    """What a loaded model was loaded from; two versions differ exactly when a load of
    the entry would load something else."""

    target: str
    options: tuple[tuple[str, str], ...]
    runtime: tuple[tuple[str, str], ...]
    # (size, mtime_ns, inode) of the file or folder the entry names; None when it names
    # none, or names one that cannot be read now (then every load is a change).
    file: tuple[int, int, int] | None


def entry_version(entry: CatalogEntry) -> EntryVersion:
    """The version of ``entry`` as it is now on disk (one ``stat``, nothing read)."""
    ref = entry.ref
    return EntryVersion(
        target=ref.target,
        options=_items(ref.options),
        runtime=_items(ref.runtime),
        file=_stat(ref.options.get("location")),
    )


def _items(values: dict[str, Any]) -> tuple[tuple[str, str], ...]:
    return tuple(sorted((k, repr(v)) for k, v in values.items()))


def _stat(location: object) -> tuple[int, int, int] | None:
    if not isinstance(location, str) or not location:
        return None
    try:
        st = os.stat(location)  # follows a link: a relinked file is a new version
    except OSError:
        return None
    return (st.st_size, st.st_mtime_ns, st.st_ino)


class ReplaceListener(Protocol):
    """What switches a model's backend to its new version."""

    def model_replaced(self, name: str) -> Callable[[], Awaitable[None]]:
        """The engine now serves ``name``'s new version: build its backend in place of
        the old one; return what closes the old backend (called once the old version
        has retired). Raising undoes the switch and fails the replace."""


async def replace(
    engine: Engine, name: str, cfg: ModelConfig, listener: ReplaceListener | None
) -> Callable[[], Awaitable[None]]:
    """Steps 1 and 2: load ``cfg`` beside loaded model ``name`` and serve it. Returns
    step 3, the old version's retirement (await it in the background).

    Raises ``ModelLoadError`` with the reason when the new version cannot load or its
    backend cannot be built; the old version then serves on as before.
    """
    old_cfg = engine.configs[name]
    fresh = await engine.load_beside(name, cfg)
    old = engine.switch(name, fresh, cfg)
    try:
        close_backend = listener.model_replaced(name) if listener is not None else None
    except Exception as exc:
        engine.switch(name, old, old_cfg)  # ``fresh`` now retires, having admitted nothing
        await engine.retire(fresh)
        raise ModelLoadError(name, f"{type(exc).__name__}: {exc}") from exc

    async def retire() -> None:
        try:
            await engine.retire(old)
        finally:
            if close_backend is not None:
                await close_backend()

    return retire
