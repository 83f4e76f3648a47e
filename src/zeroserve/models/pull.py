"""Fetching a model into the cache: ``hf:`` through huggingface_hub, ``https:`` by hand.

Nothing here runs unless a user asks for a pull (docs/models.md, "Pulling models"). The hub
path leaves resuming, caching, ``HF_ENDPOINT``, ``HF_TOKEN`` and ``HF_HUB_OFFLINE`` to
huggingface_hub. A URL is written to ``NAME.part`` with a ``Range`` request that continues
what an earlier, interrupted pull left, and renamed once complete. Plain ``http://`` is
refused unless ``ZEROSERVE_PULL_ALLOW_HTTP=1`` (loopback test hubs only).
"""

from __future__ import annotations

import http.client
import os
import urllib.request
from pathlib import Path
from urllib.parse import urlsplit

from zeroserve.errors import RequestError, UpstreamError
from zeroserve.models.cache import PullSource, cache_dir, parse_source, verify_pin

#: Bytes per read while streaming a URL download to its ``.part`` file.
DOWNLOAD_CHUNK_BYTES = 1 << 20


def pull(text: str, root: Path | None = None) -> Path:
    """Fetch the source into the cache (or find it there) and return the checked file.

    Raises:
        RequestError: a bad source, or an unusable choice of file (the message lists them).
        HashMismatch: the file does not match its pin; it was deleted.
    """
    source = parse_source(text)
    base = cache_dir() if root is None else root
    path = _pull_hf(source, base) if source.kind == "hf" else _pull_url(source, base)
    verify_pin(path, source.sha256)
    return path


def _pull_hf(source: PullSource, base: Path) -> Path:
    from huggingface_hub import HfApi, hf_hub_download

    name = source.selector
    if not name.endswith(".gguf"):
        api = HfApi(endpoint=os.environ.get("HF_ENDPOINT") or None)
        listed = api.list_repo_files(source.repo)
        ggufs = sorted(f for f in listed if f.endswith(".gguf"))
        wanted = [f for f in ggufs if name.lower() in f.lower()] if name else ggufs
        if len(wanted) != 1:
            raise RequestError(
                f"hf:{source.repo}:{name or '(none)'} matches {len(wanted)} GGUF files;"
                f" choose one of: {', '.join(ggufs) or '(no .gguf files)'}"
            )
        name = wanted[0]
    # HF_ENDPOINT read per call: huggingface_hub reads it once, at its import.
    endpoint = os.environ.get("HF_ENDPOINT") or None
    return Path(hf_hub_download(source.repo, name, cache_dir=str(base / "hf"), endpoint=endpoint))


def _pull_url(source: PullSource, base: Path) -> Path:
    url = source.selector
    parts = urlsplit(url)
    if parts.scheme != "https" and os.environ.get("ZEROSERVE_PULL_ALLOW_HTTP") != "1":
        raise RequestError(f"refusing plain http for {url}: use https://")
    name = Path(parts.path).name
    if not name or name.startswith("."):
        raise RequestError(f"URL {url} names no file")
    folder = base / "url" / (parts.hostname or "host")
    folder.mkdir(parents=True, exist_ok=True)
    final = folder / name
    if final.exists():
        return final
    part = folder / (name + ".part")
    have = part.stat().st_size if part.exists() else 0
    request = urllib.request.Request(url, headers={"Range": f"bytes={have}-"} if have else {})
    with urllib.request.urlopen(request) as response:
        resumed = bool(have) and response.status == 206
        length = response.headers.get("Content-Length")
        expected = (have if resumed else 0) + int(length) if length is not None else None
        with part.open("ab" if resumed else "wb") as out:
            try:
                while chunk := response.read(DOWNLOAD_CHUNK_BYTES):
                    out.write(chunk)
            except http.client.IncompleteRead as cut:
                out.write(cut.partial)
    got = part.stat().st_size
    if expected is not None and got != expected:
        # A premature close can read as a clean end; the size decides. The .part stays,
        # so the next pull continues from it.
        raise UpstreamError(
            f"download of {url} stopped at {got} of {expected} bytes; pull again to resume"
        )
    part.replace(final)
    return final
