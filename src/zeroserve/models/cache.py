"""The model cache: where pulled models live, what a pull source names, and hash pins.

Pulling is opt-in and the default is offline (docs/models.md, "Pulling models"). This module
owns the parts with no network: the cache directory (``ZEROSERVE_CACHE``, else
``$XDG_CACHE_HOME/zeroserve``, else ``~/.cache/zeroserve``), the source syntax, the
``sha256=`` pin check, and what the cache holds: :func:`cached_models` (every model, as
``zeroserve list`` shows them) and :func:`catalog_models` (one file per model name, as the
catalog serves them; docs/models.md, "Pulled models in the catalog").

The name index (:data:`NAMES_FILE`, at the cache root) keeps the name each pull gave its
file, so a model pulled as ``chat`` is ``chat`` after a restart too. A file named there
goes by its names only; any other file by its own name without ``.gguf``
(docs/decisions/0053-pulled-models-in-the-catalog.md). The index is replaced whole (a
temporary file renamed over it), so a reader sees the old one or the new one, never half;
writers (``zeroserve pull`` and ``rm``, ``POST /models/pull``, a scan dropping the names
of deleted files) take a lock file first, so two processes never lose each other's names.
A corrupt index is logged and read as empty: the files are named after themselves until
the next pull or ``rm`` replaces it (keeping the bad one beside it).

Source syntax: ``hf:ORG/REPO[:FILE_OR_QUANT][?sha256=HEX]`` or ``https://...[?sha256=HEX]``: the
pin is written as a model spec's ``sha256`` option is (``llamacpp:PATH?sha256=HEX``), one syntax
for both (after a URL's own query, ``&sha256=HEX``).
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import logging
import os
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import TypeVar

from zeroserve.errors import RequestError

#: Bytes read per step while hashing a file: large enough to keep the loop cheap on
#: multi-GiB GGUF files, small enough to stay out of the way of the server's memory.
HASH_CHUNK_BYTES = 1 << 20

_PIN = re.compile(r"[?&]sha256=([0-9a-fA-F]{64})$")
#: A model name a client can write in a request's ``model`` (and in a URL path: no ``/``):
#: what a cached file's name must be to enter the catalog, and what a pull may name.
MODEL_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$")
_REPO = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*$")

#: The name index at the cache root: ``{"version": 1, "names": {NAME: {"path": PATH,
#: "source": SOURCE}}}``, PATH relative to the root (so a moved cache keeps its names),
#: SOURCE what the pull was given.
NAMES_FILE = "names.json"
_NAMES_LOCK = "names.lock"
_NAMES_VERSION = 1
_T = TypeVar("_T")
log = logging.getLogger("zeroserve")


class HashMismatch(RequestError):
    """A downloaded or cached file does not match its ``sha256=`` pin; the file is deleted."""


@dataclass(frozen=True, slots=True)
class PullSource:
    """A parsed pull source.

    Attributes:
        kind: ``"hf"`` or ``"url"``.
        repo: ``ORG/REPO`` for ``hf``; empty for a URL.
        selector: a file name or a quant tag for ``hf`` (empty: the repo's single GGUF);
            the URL itself for ``url``.
        sha256: the lowercase hex pin, or ``None``.
    """

    kind: str
    repo: str
    selector: str
    sha256: str | None


def parse_source(text: str) -> PullSource:
    """Parse ``hf:ORG/REPO[:FILE_OR_QUANT][?sha256=HEX]`` or ``https://URL[?sha256=HEX]``.

    Raises:
        RequestError: the text is neither form; the message names it.
    """
    pin: str | None = None
    match = _PIN.search(text)
    body = text
    if match is not None:
        pin = match.group(1).lower()
        body = text[: match.start()]
    elif "@sha256=" in text:
        raise RequestError(
            f"bad sha256 pin in {text!r}: write it as a model spec's option, ?sha256=HEX"
        )
    elif "sha256=" in text:
        raise RequestError(f"bad sha256 pin in {text!r}: expected 64 hex digits")
    if body.startswith("hf:"):
        repo, _, selector = body[3:].partition(":")
        if not _REPO.match(repo):
            raise RequestError(f"bad hf source {text!r}: expected hf:ORG/REPO[:FILE_OR_QUANT]")
        if "/" in selector or selector.startswith("."):
            raise RequestError(f"bad file in hf source {text!r}")
        return PullSource("hf", repo, selector, pin)
    if body.startswith(("https://", "http://")):
        return PullSource("url", "", body, pin)
    raise RequestError(f"unknown pull source {text!r}: expected hf:ORG/REPO[:FILE] or https://URL")


def cache_dir() -> Path:
    """The cache root: ``ZEROSERVE_CACHE``, else the user's cache directory."""
    explicit = os.environ.get("ZEROSERVE_CACHE")
    if explicit:
        return Path(explicit)
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg) if xdg else Path.home() / ".cache"
    return base / "zeroserve"


def file_sha256(path: Path) -> str:
    """The lowercase hex SHA-256 of a file, read in :data:`HASH_CHUNK_BYTES` steps."""
    digest = hashlib.sha256()
    buffer = bytearray(HASH_CHUNK_BYTES)
    view = memoryview(buffer)
    with path.open("rb", buffering=0) as handle:
        while n := handle.readinto(buffer):
            digest.update(view[:n])
    return digest.hexdigest()


def verify_pin(path: Path, expected: str | None) -> None:
    """Check ``path`` against its pin before it is used; on a mismatch delete it.

    Raises:
        HashMismatch: names the expected and the actual hash.
    """
    if expected is None:
        return
    actual = file_sha256(path)
    if actual != expected.lower():
        # The hub cache's file is a link to its blob: delete the blob too, or the next
        # pull would find it and link it again without fetching.
        real = path.resolve()
        path.unlink(missing_ok=True)
        real.unlink(missing_ok=True)
        raise HashMismatch(
            f"sha256 mismatch for {path.name}: expected {expected.lower()}, got {actual};"
            " the file was deleted"
        )


def check_model_name(name: str) -> str:
    """``name`` if it is a model name (:data:`MODEL_NAME`), else ``RequestError`` naming it."""
    if not MODEL_NAME.match(name):
        raise RequestError(f"bad model name {name!r}: letters, digits and ._:- only")
    return name


@dataclass(frozen=True, slots=True)
class NamedFile:
    """One name in the index: the cached file it names and the source it was pulled from."""

    path: Path
    source: str


def read_names(root: Path | None = None) -> dict[str, NamedFile]:
    """The name index, by name; empty when there is none. A corrupt one (unreadable, not
    JSON, not the shape :func:`name_file` writes, a bad name, a path out of the cache) is
    logged and read as empty, so the cache's files go by their own names."""
    base = cache_dir() if root is None else root
    try:
        return _parse_names(base, (base / NAMES_FILE).read_bytes())
    except FileNotFoundError:
        return {}
    except (OSError, ValueError, RecursionError) as exc:
        log.warning(
            "pull cache: ignoring the corrupt name index %s (%s); models are named after "
            "their files until the next pull or rm replaces it",
            base / NAMES_FILE,
            exc,
        )
        return {}


def name_file(name: str, path: Path, source: str, root: Path | None = None) -> Path | None:
    """Record in the index that ``name`` names the cached file ``path``, pulled from
    ``source``; returns the other file the name named before, if any (the name now names
    ``path``).

    Raises:
        RequestError: ``name`` is no model name, or ``path`` is not in the cache.
    """
    base = cache_dir() if root is None else root
    check_model_name(name)
    try:
        relative = Path(os.path.abspath(path)).relative_to(os.path.abspath(base))
    except ValueError:
        raise RequestError(f"{path} is not in the cache {base}") from None
    named = NamedFile(base / relative, source)

    def change(names: dict[str, NamedFile]) -> Path | None:
        old = names.get(name)
        names[name] = named
        return old.path if old is not None and old.path != named.path else None

    return _update_names(base, change)


def remove_model(name: str, root: Path | None = None) -> bool:
    """``zeroserve rm NAME``: take ``name`` out of the index and delete its file unless
    another name still names it; a name the index lacks deletes the files going by that
    name (their own). False when nothing in the cache goes by ``name``."""
    base = cache_dir() if root is None else root
    if not base.is_dir():
        return False

    def change(names: dict[str, NamedFile]) -> bool:
        named = names.pop(name, None)
        if named is not None:
            target = named.path.resolve()
            if all(other.path.resolve() != target for other in names.values()):
                _delete(named.path)
            return True
        matches = [path for held, path in _listed(base, names) if held == name]
        for path in matches:
            _delete(path)
        return bool(matches)

    return _update_names(base, change)


def _delete(path: Path) -> None:
    # The hub cache's file is a link to its blob: the blob goes too.
    target = path.resolve()
    path.unlink(missing_ok=True)
    if target != path:
        target.unlink(missing_ok=True)


def _parse_names(base: Path, data: bytes) -> dict[str, NamedFile]:
    doc = json.loads(data)
    if not isinstance(doc, dict) or doc.get("version") != _NAMES_VERSION:
        raise ValueError(f"not a version {_NAMES_VERSION} name index")
    entries = doc.get("names")
    if not isinstance(entries, dict):
        raise ValueError("no 'names' object")
    found: dict[str, NamedFile] = {}
    for name, item in entries.items():
        path = item.get("path") if isinstance(item, dict) else None
        source = item.get("source") if isinstance(item, dict) else None
        place = PurePosixPath(path) if isinstance(path, str) else None
        if (
            not MODEL_NAME.match(name)
            or not isinstance(source, str)
            or place is None
            or place.is_absolute()
            or ".." in place.parts
            or not place.parts
        ):
            raise ValueError(f"entry number {len(found) + 1} is not a name, a path and a source")
        found[name] = NamedFile(base.joinpath(*place.parts), source)
    return found


def _update_names(base: Path, change: Callable[[dict[str, NamedFile]], _T]) -> _T:
    """Run ``change`` on the index under its lock, and write the index when it changed (or
    was corrupt: moved aside, and a fresh one written)."""
    base.mkdir(parents=True, exist_ok=True)
    index = base / NAMES_FILE
    with (base / _NAMES_LOCK).open("a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        corrupt = False
        try:
            names = _parse_names(base, index.read_bytes())
        except FileNotFoundError:
            names = {}
        except (ValueError, RecursionError) as exc:
            kept = index.with_name(NAMES_FILE + ".bad")
            index.replace(kept)
            log.warning("pull cache: the corrupt name index (%s) was moved to %s", exc, kept)
            names, corrupt = {}, True
        before = dict(names)
        result = change(names)
        if corrupt or names != before:
            _write_names(base, names)
        return result


def _write_names(base: Path, names: dict[str, NamedFile]) -> None:
    doc = {
        "version": _NAMES_VERSION,
        "names": {
            name: {"path": named.path.relative_to(base).as_posix(), "source": named.source}
            for name, named in sorted(names.items())
        },
    }
    temporary = base / f".{NAMES_FILE}.{os.getpid()}.tmp"
    with temporary.open("w", encoding="utf-8") as out:
        json.dump(doc, out, indent=1)
        out.write("\n")
        out.flush()
        os.fsync(out.fileno())
    temporary.replace(base / NAMES_FILE)


def _live_names(base: Path) -> dict[str, NamedFile]:
    """The index's names whose file is there; the others are dropped from the index."""
    names = read_names(base)
    if all(named.path.is_file() for named in names.values()):
        return names

    def drop_gone(held: dict[str, NamedFile]) -> None:
        for name in [n for n, named in held.items() if not named.path.is_file()]:
            del held[name]

    try:
        _update_names(base, drop_gone)
    except OSError as exc:  # a read-only cache: the names stay out of this scan all the same
        log.warning("pull cache: cannot drop the names of deleted files: %s", exc)
    return {name: named for name, named in names.items() if named.path.is_file()}


def _listed(base: Path, names: dict[str, NamedFile]) -> list[tuple[str, Path]]:
    named = {entry.path for entry in names.values()}
    found = [
        (path.stem, path)
        for path in base.rglob("*.gguf")
        if path.is_file() and not path.name.endswith(".part") and path not in named
    ]
    return sorted([*((name, entry.path) for name, entry in names.items()), *found])


def _servable(name: str, path: Path) -> bool:
    return (
        bool(MODEL_NAME.match(name)) and "?" not in str(path) and "mmproj" not in path.name.lower()
    )


def cached_models(root: Path | None = None) -> list[tuple[str, Path]]:
    """The models in the cache as (name, path) pairs, as ``zeroserve list`` shows them: a
    file named in the index under each of its names, any other GGUF file under its name
    without ``.gguf`` (a ``.part`` file, a download in progress, is none). Sorted by name.
    """
    base = cache_dir() if root is None else root
    if not base.is_dir():
        return []
    return _listed(base, _live_names(base))


def catalog_models(root: Path | None = None) -> dict[str, Path]:
    """The cached files the catalog serves, by model name (docs/models.md, "Pulled models
    in the catalog").

    A name in the index serves its file (and the file goes by no other name); any other
    file goes by its name without ``.gguf``, as ``zeroserve list`` shows it, unless the
    index gives that name to a file (a name a pull gave wins). Left out: a name that is
    no model name (:data:`MODEL_NAME`), a path a model spec cannot hold (``?``), and a
    multimodal projector (``mmproj`` in its file's name: llama.cpp's router tells
    projectors apart the same way; one is given to a model as its ``mmproj`` option).
    Two files with one name (two repositories' ``model.gguf``, two revisions of one
    file): the one written last is served, the other only listed; ties go to the first
    path in sorted order, so the choice never depends on the directory's order.
    """
    base = cache_dir() if root is None else root
    if not base.is_dir():
        return {}
    names = _live_names(base)
    served = {name: named.path for name, named in names.items() if _servable(name, named.path)}
    chosen: dict[str, tuple[float, Path]] = {}
    for name, path in _listed(base, names):
        if name in names or not _servable(name, path):
            continue
        try:
            written = path.resolve().stat().st_mtime
        except OSError:  # a link to a blob deleted meanwhile
            continue
        held = chosen.get(name)
        if held is None or written > held[0]:
            chosen[name] = (written, path)
    served.update((name, path) for name, (_, path) in chosen.items())
    return dict(sorted(served.items()))
