"""Which build of zeroserve runs: pure Python, or with the hot path compiled by mypyc
(docs/decisions/0007-compiled-build.md).

``tools/build_compiled.py`` (run by ``make compiled``) compiles ``COMPILED_MODULES`` in
place: each gets a C extension next to its ``.py``, and the build writes ``MANIFEST``
next to this file, the SHA-256 of every compiled module's source at build time. An
extension module is found before a ``.py`` of the same name, so ``guard()``, run by
``zeroserve/__init__.py`` before any other submodule is imported, decides which one
loads:

* ``ZEROSERVE_PURE=1`` in the environment: the sources, always;
* a compiled module whose source no longer matches the manifest (edited since the
  build), or extensions without a manifest: the sources of *every* compiled module (they
  call each other directly in C, so one stale module makes all of them stale), with a
  ``RuntimeWarning`` naming what changed;
* otherwise the extensions.

So a stale extension never shadows an edited ``.py``: it costs speed and a warning, not
correctness. This module imports nothing of zeroserve's and is never compiled.
"""

from __future__ import annotations

import hashlib
import importlib.abc
import importlib.machinery
import importlib.util
import json
import os
import sys
import warnings
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType

# The hot path (docs/decisions/0007-compiled-build.md): the sans-I/O connection and
# its parsers and framing, the server's asyncio glue, the runtime's stream channel, and
# what every request passes through above them: the request and its route, the raw
# endpoint, the OpenAI routes' request path (the chat front ends, the one chat request and
# its outputs, the local backend and its generations, telemetry, stream timing), the
# edge's per-request context with the API key check and the key's quota, admission, the
# model handle, the inline executor and the arena; and what the hot path calls on every
# request or piece (responses, deadlines, metrics, batchers, the runtime's shared
# helpers, arena offsets, the deadline clock, OpenAI chunk encoding). Not
# app/openai/streaming.py: mypyc does not compile async generators. Not the classes
# interpreted code subclasses (app/application.py's App, which a test extends;
# runtime/contract.py's Executor and Producer, which the process and Ray executors
# implement): an interpreted class cannot subclass a compiled one.
COMPILED_MODULES: tuple[str, ...] = (
    "zeroserve.http.chunked",
    "zeroserve.http.client",
    "zeroserve.http.connection",
    "zeroserve.http.framing",
    "zeroserve.http.limits",
    "zeroserve.http.request",
    "zeroserve.server.connection",
    "zeroserve.server.flow",
    "zeroserve.server.sinks",
    "zeroserve.server.stream",
    "zeroserve.server.turns",
    "zeroserve.runtime.channel",
    "zeroserve.runtime.stream",
    "zeroserve.runtime.admission",
    "zeroserve.runtime.arena",
    "zeroserve.runtime.handle",
    "zeroserve.runtime.inproc",
    "zeroserve.app.request",
    "zeroserve.app.openai.routes",
    "zeroserve.app.openai.chat",
    "zeroserve.app.chat.request",
    "zeroserve.app.chat.output",
    "zeroserve.app.chat.choices",
    "zeroserve.app.backends.table",
    "zeroserve.app.backends.local",
    "zeroserve.app.backends.generation",
    "zeroserve.app.openai.telemetry",
    "zeroserve.runtime.timing",
    "zeroserve.app.router",
    "zeroserve.app.endpoints.raw",
    "zeroserve.edge.gate",
    "zeroserve.edge.keys",
    "zeroserve.edge.quotas",
    "zeroserve.edge.request_id",
    "zeroserve.app.response",
    "zeroserve.app.deadlines",
    "zeroserve.metrics",
    "zeroserve.runtime.results",
    "zeroserve.runtime.model_calls",
    "zeroserve.runtime.stepping",
    "zeroserve.runtime.waiters",
    "zeroserve.runtime.tensors",
    "zeroserve.runtime.clock",
    "zeroserve.runtime.batcher",
    "zeroserve.app.openai.chunks",
)
PURE_ENV = "ZEROSERVE_PURE"  # "1": load the pure-Python sources even when compiled
MANIFEST = "_compiled.json"  # {"mypy": version, "modules": {name: source sha256}}

PACKAGE_DIR = Path(__file__).resolve().parent
SOURCE_ROOT = PACKAGE_DIR.parent

# Why the sources are loaded instead of the extensions (None: the extensions load).
_pure_reason: str | None = None


def source_path(module: str) -> Path:
    return SOURCE_ROOT.joinpath(*module.split(".")).with_suffix(".py")


def source_digest(module: str) -> str:
    return hashlib.sha256(source_path(module).read_bytes()).hexdigest()


def extension_paths(module: str) -> list[Path]:
    """The module's compiled extensions present on disk (normally none or one)."""
    base = source_path(module).with_suffix("")
    return [
        p
        for s in importlib.machinery.EXTENSION_SUFFIXES
        if (p := base.with_name(base.name + s)).exists()
    ]


def read_manifest() -> dict[str, str] | None:
    """Module name -> source digest at build time, or None without a compiled build."""
    try:
        doc = json.loads((PACKAGE_DIR / MANIFEST).read_text())
    except FileNotFoundError:
        return None
    except ValueError:
        return {}
    modules = doc.get("modules") if isinstance(doc, dict) else None
    return {str(k): str(v) for k, v in modules.items()} if isinstance(modules, dict) else {}


def stale_modules(manifest: dict[str, str]) -> list[str]:
    """Compiled modules (with an extension on disk) whose source differs from the build's."""
    return [
        m
        for m in COMPILED_MODULES
        if extension_paths(m) and (manifest.get(m) is None or manifest[m] != source_digest(m))
    ]


class _SourceFinder(importlib.abc.MetaPathFinder):
    """Finds the ``.py`` of the compiled modules, ahead of their extensions."""

    def __init__(self, names: Sequence[str]) -> None:
        self._names = frozenset(names)

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname not in self._names:
            return None
        src = source_path(fullname)
        return importlib.util.spec_from_file_location(fullname, src) if src.exists() else None


def guard() -> None:
    """Decide, once and before any compiled module is imported, which build loads."""
    global _pure_reason
    present = [m for m in COMPILED_MODULES if extension_paths(m)]
    manifest = read_manifest()
    if os.environ.get(PURE_ENV) == "1":
        _pure_reason = f"{PURE_ENV}=1"
    elif not present:
        _pure_reason = "not compiled"
    elif manifest is None:
        _pure_reason = f"compiled modules without {MANIFEST}"
    elif stale := stale_modules(manifest):
        _pure_reason = "stale compiled build: changed since it was built: " + ", ".join(stale)
        warnings.warn(
            f"zeroserve: {_pure_reason}; running the pure-Python sources "
            "(`make compiled` rebuilds, `make clean-compiled` removes the build)",
            RuntimeWarning,
            stacklevel=2,
        )
    if _pure_reason is not None and present:
        sys.meta_path.insert(0, _SourceFinder(COMPILED_MODULES))


def loaded_compiled() -> list[str]:
    """The compiled modules that are extensions in this process (imports them)."""
    out = []
    for name in COMPILED_MODULES:
        module = importlib.import_module(name)
        origin = module.__file__ or ""
        if origin.endswith(tuple(importlib.machinery.EXTENSION_SUFFIXES)):
            out.append(name)
    return out


def describe() -> str:
    """One line for ``zeroserve --version``: the build that is running, and why."""
    compiled = loaded_compiled()
    if compiled:
        return "compiled with mypyc: " + ", ".join(m.removeprefix("zeroserve.") for m in compiled)
    return f"pure Python: {_pure_reason}" if _pure_reason else "pure Python"
