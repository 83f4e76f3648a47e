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
from urllib.parse import parse_qsl, urlencode, urlsplit

from zeroserve.errors import ConfigError, RequestError, UpstreamError, ZeroserveError
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


# What a ``--model`` spec starts with (after ``NAME=``) when it names a pull source.
PULL_PREFIXES = ("hf:", "https://", "http://")


def names_pull(spec: str) -> bool:
    """Whether ``--model`` ``spec`` (``[NAME=]SOURCE[?options]``) names a pull source."""
    name, sep, rest = spec.partition("=")
    body = rest if sep and not any(c in name for c in ":/?") else spec
    return body.startswith(PULL_PREFIXES)


def spec_from_pull(spec: str, allow_pull: bool, root: Path | None = None) -> str:
    """A ``--model NAME=hf:ORG/REPO[:FILE][?options]`` spec (or ``NAME=https://...``) as
    the llama.cpp spec of the file it names, pulled into the cache first (docs/models.md,
    "Pulling models"); any other spec unchanged. ``sha256=`` among the options pins the
    file (checked by the pull); the other options go to llama.cpp. Without a ``NAME=``
    the model is named after the file.

    Raises:
        ConfigError: the spec names a pull and ``allow_pull`` is false (naming the flag),
            or the pull failed (naming the source and why).
    """
    if not names_pull(spec):
        return spec
    name, sep, rest = spec.partition("=")
    if not sep or any(c in name for c in ":/?"):
        name, rest = "", spec
    if not allow_pull:
        raise ConfigError(
            f"model spec {spec!r} names {rest.partition('?')[0]!r} to fetch: start with "
            "--allow-pull to pull it into the cache (nothing is fetched without it), or "
            "`zeroserve pull` it first and name the file"
        )
    location, _, query = rest.partition("?")
    options = [(k, v) for k, v in parse_qsl(query, keep_blank_values=True) if k != "sha256"]
    pins = [v for k, v in parse_qsl(query, keep_blank_values=True) if k == "sha256"]
    source = location + (f"?sha256={pins[-1]}" if pins else "")
    try:
        path = pull(source, root)
    except ZeroserveError as exc:
        raise ConfigError(f"cannot pull {location!r} for --model: {exc.message}") from exc
    except Exception as exc:  # the hub client's own errors: connection, 404, offline
        raise ConfigError(
            f"cannot pull {location!r} for --model: {type(exc).__name__}: {exc}"
        ) from exc
    text = f"{name or path.stem}=llamacpp:{path}"
    return text + ("?" + urlencode(options) if options else "")
