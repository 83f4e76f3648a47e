"""The model cache: where pulled models live, what a pull source names, and hash pins.

Pulling is opt-in and the default is offline (docs/models.md, "Pulling models"). This module
owns the parts with no network: the cache directory (``ZEROSERVE_CACHE``, else
``$XDG_CACHE_HOME/zeroserve``, else ``~/.cache/zeroserve``), the source syntax, the
``sha256=`` pin check, and what the cache holds: :func:`cached_models` (every GGUF file, as
``zeroserve list`` shows them) and :func:`catalog_models` (one file per model name, as the
catalog serves them; docs/models.md, "Pulled models in the catalog").

Source syntax: ``hf:ORG/REPO[:FILE_OR_QUANT][?sha256=HEX]`` or ``https://...[?sha256=HEX]``: the
pin is written as a model spec's ``sha256`` option is (``llamacpp:PATH?sha256=HEX``), one syntax
for both (after a URL's own query, ``&sha256=HEX``).
"""

from __future__ import annotations

import hashlib
import os
import re
from dataclasses import dataclass
from pathlib import Path

from zeroserve.errors import RequestError

#: Bytes read per step while hashing a file: large enough to keep the loop cheap on
#: multi-GiB GGUF files, small enough to stay out of the way of the server's memory.
HASH_CHUNK_BYTES = 1 << 20

_PIN = re.compile(r"[?&]sha256=([0-9a-fA-F]{64})$")
#: A model name a client can write in a request's ``model`` (and in a URL path: no ``/``):
#: what a cached file's name must be to enter the catalog, and what a pull may name.
MODEL_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$")
_REPO = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*$")


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


def cached_models(root: Path | None = None) -> list[tuple[str, Path]]:
    """The GGUF files in the cache as (name, path) pairs, named after the file's stem.

    A ``.part`` file (a download in progress) is not a model. Sorted by name.
    """
    base = cache_dir() if root is None else root
    if not base.is_dir():
        return []
    found = [
        (path.stem, path)
        for path in base.rglob("*.gguf")
        if path.is_file() and not path.name.endswith(".part")
    ]
    return sorted(found)


def catalog_models(root: Path | None = None) -> dict[str, Path]:
    """The cached files the catalog serves, by model name (docs/models.md, "Pulled models
    in the catalog").

    A file's model name is its name without ``.gguf``, as ``zeroserve list`` shows it. Left
    out: a name that is no model name (:data:`MODEL_NAME`), or a path a model spec cannot
    hold (``?``), and a multimodal projector (``mmproj`` in its name: llama.cpp's router
    tells projectors apart the same way; one is given to a model as its ``mmproj``
    option). Two files with one name (two repositories' ``model.gguf``, two revisions of
    one file): the one written last is served, the other only listed; ties go to the
    first path in sorted order, so the choice never depends on the directory's order.
    """
    chosen: dict[str, tuple[float, Path]] = {}
    for name, path in cached_models(root):
        if not MODEL_NAME.match(name) or "?" in str(path) or "mmproj" in name.lower():
            continue
        try:
            written = path.resolve().stat().st_mtime
        except OSError:  # a link to a blob deleted meanwhile
            continue
        held = chosen.get(name)
        if held is None or written > held[0]:
            chosen[name] = (written, path)
    return {name: path for name, (_, path) in sorted(chosen.items())}
