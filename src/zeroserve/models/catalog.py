"""The catalog: what could be served (docs/architecture.md, "Models at run time").

A catalog entry is a parsed model spec (``ModelRef``) plus where it came from and the
settings that govern its life at run time (``pin``). Entries come from *sources*: the
``--model`` specs, a ``--models-dir`` repository, and the pull cache (``scan_cache``: its
GGUF files, each named as ``zeroserve list`` names it, by the name it was pulled under
when the cache's name index has one; docs/models.md, "Pulled models in the catalog").
Building the catalog opens nothing but directory listings and ``model.toml`` files;
loading is the runtime's job.

A models directory holds:

* ``NAME.gguf`` — a GGUF file, served by llama.cpp as model ``NAME``;
* ``NAME/model.toml`` — a folder with a spec and its options::

      spec = "llamacpp:weights.gguf"   # any --model SPEC; a relative location is
                                       # resolved against the folder
      pin = true                       # optional: never unloaded for idleness or LRU
      [options]                        # optional: the spec's ?key=value options
      executor = "thread"

  or, in place of ``spec``, a GGUF to pull at the model's first load (only with
  ``--allow-pull``; docs/models.md, "Pulling models")::

      source = "hf:ORG/REPO:FILE.gguf"   # or "https://HOST/PATH/FILE.gguf"
      sha256 = "64 hex digits"           # optional: the file's pin

Anything else in the directory is left alone. Two entries with one name are an error
naming both places, never a silent choice.
"""

from __future__ import annotations

import tomllib
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

from ..errors import RequestError, SpecError
from .cache import catalog_models, parse_source
from .loader import BACKENDS, ModelRef, parse_spec

# The file in a model folder that names its spec.
MODEL_TOML = "model.toml"
# Keys a model.toml may hold; any other is refused by name (nothing silently ignored).
TOML_KEYS = frozenset({"spec", "pin", "options", "source", "sha256"})


@dataclass(frozen=True)
class CatalogEntry:
    """One model the server could serve.

    Attributes:
        ref: the parsed spec (name, target, options, runtime settings).
        origin: where it was found: ``"--model"``, or the file or folder it came from.
        pin: True keeps the model loaded (no idle unload, no LRU eviction).
        source: a pull source (``hf:...`` or ``https://...``, with its ``?sha256=`` pin)
            fetched into the cache at the first load; ``ref`` then names the source as
            its location until the pull gives the file.
    """

    ref: ModelRef
    origin: str
    pin: bool = False
    source: str | None = None

    @property
    def name(self) -> str:
        return self.ref.name


# A source of entries read from one directory (the models dir, the pull cache).
EntrySource = Callable[[Path], list[CatalogEntry]]


def entries_from_specs(specs: Iterable[str]) -> list[CatalogEntry]:
    """Catalog entries for ``--model`` specs."""
    return [CatalogEntry(ref=parse_spec(text), origin="--model") for text in specs]


def scan_models_dir(root: Path) -> list[CatalogEntry]:
    """Entries for every ``*.gguf`` file and ``*/model.toml`` folder directly in ``root``.

    Raises ``SpecError`` naming the file at fault (an unreadable ``model.toml``, a bad
    spec, an unknown key) or the directory when it is missing.
    """
    if not root.is_dir():
        raise SpecError(f"models directory {str(root)!r} does not exist or is not a directory")
    entries: list[CatalogEntry] = []
    for path in sorted(root.iterdir()):
        if path.is_file() and path.suffix == ".gguf":
            spec = f"{path.stem}=llamacpp:{path.resolve()}"
            entries.append(CatalogEntry(ref=parse_spec(spec), origin=str(path)))
        elif path.is_dir() and (path / MODEL_TOML).is_file():
            entries.append(_folder_entry(path))
    return entries


def build_catalog(
    specs: Iterable[str] = (),
    dirs: Iterable[tuple[Path, EntrySource]] = (),
) -> dict[str, CatalogEntry]:
    """The catalog, by name, from ``--model`` specs and directory sources, in that order.

    Raises ``SpecError`` when two entries share a name, naming both origins.
    """
    found: list[CatalogEntry] = entries_from_specs(specs)
    for path, source in dirs:
        found.extend(source(path))
    return join_entries(found)


def scan_cache(root: Path) -> list[CatalogEntry]:
    """Entries for the pull cache's files (``cache.catalog_models``: one per name, a pulled
    file under the names its pulls gave it), each served by llama.cpp; a cache that does
    not exist yet holds none."""
    return [
        CatalogEntry(ref=parse_spec(f"{name}=llamacpp:{path}"), origin=str(path))
        for name, path in catalog_models(root).items()
    ]


def server_catalog(
    refs: Iterable[ModelRef], models_dir: Path | None, cache: Path | None = None
) -> dict[str, CatalogEntry]:
    """The serving catalog: each ``--model`` (pinned: loaded at start and kept, as a
    server without a models directory always did), every entry of ``models_dir``, and,
    when ``cache`` is given, the cache's models.

    An explicit entry wins over the cache's: a cache model whose name a ``--model`` or a
    ``models_dir`` entry gives, or whose file one of them serves (a ``--model`` pulled at
    start), is left out. Raises ``SpecError`` when two explicit entries share a name,
    naming both origins.
    """
    found = [CatalogEntry(ref=ref, origin="--model", pin=True) for ref in refs]
    if models_dir is not None:
        found.extend(scan_models_dir(models_dir))
    if cache is not None:
        names = {entry.name for entry in found}
        files = {_served_file(entry) for entry in found} - {None}
        found.extend(
            entry
            for entry in scan_cache(cache)
            if entry.name not in names and _served_file(entry) not in files
        )
    return join_entries(found)


def _served_file(entry: CatalogEntry) -> Path | None:
    """The file a llama.cpp entry serves, links resolved (a pulled file is a link into the
    hub cache's blobs); None for any other entry."""
    location = entry.ref.options.get("location")
    if entry.ref.target != BACKENDS["llamacpp"] or not isinstance(location, str):
        return None
    return Path(location).resolve()


def join_entries(found: Iterable[CatalogEntry]) -> dict[str, CatalogEntry]:
    """Entries by name; ``SpecError`` naming both origins of a name given twice."""
    catalog: dict[str, CatalogEntry] = {}
    for entry in found:
        if entry.name in catalog:
            raise SpecError(
                f"model {entry.name!r} is named twice: by {catalog[entry.name].origin} "
                f"and by {entry.origin}"
            )
        catalog[entry.name] = entry
    return catalog


def _folder_entry(folder: Path) -> CatalogEntry:
    toml_path = folder / MODEL_TOML
    try:
        data = tomllib.loads(toml_path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise SpecError(f"{toml_path}: cannot read: {exc}") from exc
    unknown = sorted(set(data) - TOML_KEYS)
    if unknown:
        raise SpecError(
            f"{toml_path}: unknown key(s) {', '.join(unknown)} "
            f"(allowed: {', '.join(sorted(TOML_KEYS))})"
        )
    source = _toml_source(data, toml_path)
    spec = f"llamacpp:{source.partition('?')[0]}" if source is not None else data.get("spec")
    if not isinstance(spec, str) or not spec:
        raise SpecError(f"{toml_path}: 'spec' must be a non-empty string")
    pin = data.get("pin", False)
    if not isinstance(pin, bool):
        raise SpecError(f"{toml_path}: 'pin' must be true or false")
    options = data.get("options", {})
    if not isinstance(options, dict) or any(isinstance(v, (dict, list)) for v in options.values()):
        raise SpecError(f"{toml_path}: [options] must be a table of plain values")
    if "?" in spec:
        raise SpecError(f"{toml_path}: put options in [options], not after '?' in 'spec'")
    text = f"{folder.name}={_resolve_location(spec, folder)}"
    if options:
        text += "?" + urlencode({k: _option_text(v) for k, v in options.items()})
    try:
        ref = parse_spec(text)
    except SpecError as exc:
        raise SpecError(f"{toml_path}: {exc}") from exc
    return CatalogEntry(ref=ref, origin=str(folder), pin=pin, source=source)


def _toml_source(data: dict[str, Any], toml_path: Path) -> str | None:
    """The pull source of a ``model.toml`` with ``source`` (its ``sha256`` appended as
    the source's pin), or None; nothing is fetched here."""
    source, pin = data.get("source"), data.get("sha256")
    if source is None:
        if pin is not None:
            raise SpecError(f"{toml_path}: 'sha256' pins a 'source'; there is none")
        return None
    if "spec" in data:
        raise SpecError(f"{toml_path}: give 'spec' or 'source', not both")
    if not isinstance(source, str) or "?" in source:
        raise SpecError(f"{toml_path}: 'source' must be hf:ORG/REPO[:FILE] or https://URL")
    text = source + (f"?sha256={pin}" if isinstance(pin, str) else "")
    if pin is not None and not isinstance(pin, str):
        raise SpecError(f"{toml_path}: 'sha256' must be a string of 64 hex digits")
    try:
        parse_source(text)
    except RequestError as exc:
        raise SpecError(f"{toml_path}: {exc.message}") from exc
    return text


def _resolve_location(spec: str, folder: Path) -> str:
    """A backend location relative to the model folder becomes an absolute path."""
    backend, colon, location = spec.partition(":")
    if colon and backend in BACKENDS and backend != "remote" and location:
        place = Path(location)
        if not place.is_absolute():
            return f"{backend}:{(folder / place).resolve()}"
    return spec


def _option_text(value: Any) -> str:
    # parse_spec coerces "true"/"false" and numbers back from text.
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)
