"""The serving process's memory policy, set once it listens
(docs/decisions/0010-memory-between-requests.md): what startup made leaves the cyclic
GC's reach (and returns to it when the server stops), and the C allocator keeps the heap
it already has instead of handing it back to the kernel after every request."""

from __future__ import annotations

import ctypes
import gc
import logging
import os
import platform

log = logging.getLogger("zeroserve.server")

# glibc's mallopt parameters (malloc.h).
M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3
# Free memory at the top of the heap that glibc keeps for the next allocation instead of
# returning it to the kernel (its default: 128 KiB, raised only after a mapped block is
# freed). A request's temporaries (a 64 KB prompt's bytes, a model's numpy scratch) are
# each below the mmap threshold, so they come from the heap; with the default, freeing
# them trims the heap, and the next request faults every page back in, zero-filled.
TRIM_THRESHOLD = 32 << 20
# Blocks at least this large are mapped on their own and unmapped when freed. Setting the
# trim threshold turns off glibc's own raising of this one (from 128 KiB up to 32 MiB as
# mapped blocks are freed), so it is set to where the raising would go for the sizes we
# see: bodies live in the arena, and below this a buffer is reused, not faulted in again.
MMAP_THRESHOLD = 4 << 20
# What glibc reads from the environment when malloc starts: a deployment that sets one
# (or a ``glibc.malloc.*`` tunable in GLIBC_TUNABLES) has chosen its own policy, and is
# left alone.
MALLOC_ENV = ("MALLOC_TRIM_THRESHOLD_", "MALLOC_MMAP_THRESHOLD_", "MALLOC_TOP_PAD_")
MALLOC_TUNABLES = "glibc.malloc."


def settle() -> None:
    """Freeze startup's objects, then keep freed heap (glibc only). Call once, when the
    server listens."""
    freeze_startup_objects()
    keep_freed_heap()


def unsettle() -> None:
    """Undo the freeze when the server stops, before its models close: frozen objects are
    never collected, so an object in a reference cycle from startup (an engine holding
    its own threads, such as llama.cpp's server in ``llamacpp``) would outlive the
    interpreter's last collection and never be finalized, its native threads still
    running as the process exits."""
    gc.unfreeze()


def freeze_startup_objects() -> None:
    """Move everything startup made (modules, models, routes: tens to hundreds of
    thousands of objects) out of the cyclic GC's reach, once it is collected: they live as
    long as the process, and every full collection would traverse them again, a pause of
    24-28 ms on the loop measured under streaming load
    (docs/decisions/0010-memory-between-requests.md). Objects made later are collected as
    usual."""
    gc.collect()
    gc.freeze()


def keep_freed_heap() -> bool:
    """Raise glibc's trim threshold (and pin its mmap threshold), so memory a request
    frees stays in the heap for the next one. True if set; False off glibc, or where the
    deployment set glibc's ``MALLOC_*`` variables or malloc tunables itself."""
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return False
    if any(os.environ.get(name) for name in MALLOC_ENV):
        return False
    if MALLOC_TUNABLES in os.environ.get("GLIBC_TUNABLES", ""):
        return False
    try:
        libc = ctypes.CDLL(None)
        ok = bool(libc.mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD) == 1)
        ok = bool(libc.mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD) == 1) and ok
    except (OSError, AttributeError):
        ok = False
    if not ok:
        log.debug("mallopt was refused; glibc keeps its own trim threshold")
    return ok
