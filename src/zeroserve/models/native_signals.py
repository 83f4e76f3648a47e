"""Keeping the process's signal handlers through native code that replaces them.

Native libraries loaded into the server install C-level handlers of their own: the
llama.cpp engine (SIGINT, SIGTERM) and Ray's core worker, whose failure handler takes
SIGTERM, prints a stack and re-raises it with the default action, so the process dies
of the signal instead of draining (docs/models.md, "Models at run time"). Python's
``signal.signal`` cannot put ours back from a thread other than the main one, and a
model loads on a worker thread, so the handlers are saved and restored with libc's
``sigaction``, which is process-wide and callable from any thread.
"""

from __future__ import annotations

import ctypes
from collections.abc import Iterator
from contextlib import contextmanager

# Bytes large enough for the C ``struct sigaction`` of any libc we run on (glibc x86-64
# uses 152); it is only saved and restored, never interpreted.
_SIGACTION_BYTES = 512


@contextmanager
def keep_signal_handlers(signals: tuple[int, ...]) -> Iterator[None]:
    """Save the process's C-level handlers of ``signals`` and put them back afterwards,
    whatever the body installed (from any thread: ``sigaction`` is process-wide)."""
    libc = ctypes.CDLL(None, use_errno=True)
    saved: list[tuple[int, ctypes.Array[ctypes.c_char]]] = []
    for sig in signals:
        buf = ctypes.create_string_buffer(_SIGACTION_BYTES)
        if libc.sigaction(sig, None, buf) == 0:
            saved.append((sig, buf))
    try:
        yield
    finally:
        for sig, buf in saved:
            libc.sigaction(sig, buf, None)
