"""Tensors as arena descriptors: how payloads cross the process boundary without a copy.

A numeric tensor that already lives in the arena (the request body's lease, or an output
a worker wrote) is described by ``(offset, length, dtype, shape)`` and rebuilt on the
other side as ``numpy.frombuffer`` over the same shared pages. Whether an array lives in
the arena is decided by its address: ``arena.address <= data < arena.address + size``.

``BYTES`` tensors (1-D object arrays of ``bytes``, KServe V2's BYTES) are laid out in a
lease as the V2 binary extension does: each element a 4-byte little-endian length
(:data:`BYTES_LENGTH`), then its bytes. This module is the one implementation of that
layout: the process executor uses it in the arena, and ``app/kserve/codec.py`` reads
request tensors with :func:`read_bytes_tensor` and frames outputs with
:data:`BYTES_LENGTH`.
"""

from __future__ import annotations

import ctypes
import struct
from collections.abc import Iterable, Sequence
from typing import Any

import msgspec
import numpy as np

from ..errors import RequestError

BYTES = "BYTES"
# The length prefix of every BYTES element: 4 bytes, little-endian, unsigned.
BYTES_LENGTH = struct.Struct("<I")
_LEN = BYTES_LENGTH


class TensorDesc(msgspec.Struct, array_like=True, frozen=True):
    """Where a tensor lives in the arena. ``dtype`` is numpy's ``dtype.str`` or ``BYTES``."""

    offset: int
    length: int
    dtype: str
    shape: tuple[int, ...]


def buffer_address(buf: Any) -> int:
    """Address of the first byte of a (contiguous) buffer."""
    arr = np.frombuffer(buf, dtype=np.uint8, count=1)
    return int(arr.ctypes.data)


def as_array(value: Any, *, name: str = "") -> np.ndarray:
    """A payload value as an ndarray: ndarrays as they are, buffers as ``uint8`` views."""
    if isinstance(value, np.ndarray):
        return value
    if isinstance(value, bytes | bytearray | memoryview):
        mv = memoryview(value)
        if not mv.contiguous:
            raise RequestError(f"input {name!r} is not a contiguous buffer", param=name)
        return np.frombuffer(mv.cast("B") if mv.format != "B" else mv, dtype=np.uint8)
    raise RequestError(
        f"input {name!r} must be a numpy array or a buffer, not {type(value).__name__}",
        param=name,
    )


def is_bytes_tensor(arr: np.ndarray) -> bool:
    return arr.dtype == object


def arena_offset(arr: np.ndarray, base: int, size: int) -> int | None:
    """Offset of ``arr``'s data in an arena mapped at ``base``, or None if it is elsewhere
    (or not C-contiguous, so not describable by offset and shape)."""
    flags = arr.flags
    if arr.dtype == object or not flags.c_contiguous:
        return None
    nbytes = arr.nbytes
    if not nbytes:
        return None
    addr = _address(arr, flags.writeable)
    if base <= addr and addr + nbytes <= base + size:
        return addr - base
    return None


def _address(arr: np.ndarray, writeable: bool) -> int:
    """The address of a non-empty C-contiguous array's first byte. Once per response,
    so the cheapest way counts: a ctypes view of a writable buffer (the arena's are) is
    0.5 us here, against 1.7-2.4 us for ``arr.ctypes.data`` (a Python-level object per
    call) and ``__array_interface__`` (a dict of the whole layout); a read-only array
    (``frombuffer`` of bytes) can only take the latter."""
    if writeable:
        return ctypes.addressof(ctypes.c_char.from_buffer(arr))  # type: ignore[arg-type]
    address: int = arr.__array_interface__["data"][0]
    return address


def bytes_tensor_size(items: Iterable[Any]) -> int:
    total = 0
    for item in items:
        if not isinstance(item, bytes | bytearray | memoryview):
            raise RequestError(f"BYTES tensor elements must be bytes, not {type(item).__name__}")
        total += _LEN.size + memoryview(item).nbytes
    return total


def write_bytes_tensor(items: Sequence[Any], out: memoryview) -> None:
    pos = 0
    for item in items:
        mv = memoryview(item).cast("B")
        _LEN.pack_into(out, pos, mv.nbytes)
        pos += _LEN.size
        out[pos : pos + mv.nbytes] = mv
        pos += mv.nbytes


def read_bytes_tensor(buf: memoryview, count: int, what: str = "BYTES tensor") -> np.ndarray:
    """The ``count`` elements laid out in ``buf`` (each copied into its own ``bytes``, as
    the model API wants), which must hold exactly those elements. ``RequestError``
    naming ``what`` otherwise (a truncated element, one past the end, bytes left over)."""
    size = buf.nbytes
    # Each element takes at least its length prefix: check before allocating ``count``.
    if count * _LEN.size > size:
        raise RequestError(
            f"{what}: {count} BYTES elements cannot fit their length prefixes in {size} bytes"
        )
    out = np.empty(count, dtype=object)
    pos = 0
    unpack = _LEN.unpack_from
    for i in range(count):
        if pos + _LEN.size > size:
            raise RequestError(f"{what}: BYTES element {i} is truncated")
        (n,) = unpack(buf, pos)
        pos += _LEN.size
        if n > size - pos:
            raise RequestError(
                f"{what}: BYTES element {i} declares {n} bytes, past its tensor's end"
            )
        out[i] = bytes(buf[pos : pos + n])
        pos += n
    if pos != size:
        raise RequestError(
            f"{what}: {size - pos} bytes follow the last of its {count} BYTES elements"
        )
    return out


def from_desc(view: memoryview, desc: TensorDesc) -> np.ndarray:
    """Rebuild a tensor from its descriptor over an arena mapping (no copy for numerics)."""
    region = view[desc.offset : desc.offset + desc.length]
    if desc.dtype == BYTES:
        return read_bytes_tensor(region, desc.shape[0] if desc.shape else 0)
    return np.frombuffer(region, dtype=np.dtype(desc.dtype)).reshape(desc.shape)


def write_pending(
    view: memoryview,
    pending: Sequence[tuple[dict[str, TensorDesc], str, np.ndarray, int]],
    offsets: Sequence[int],
) -> int:
    """Write each pending output ``(descs, key, array, nbytes)`` into the arena at its
    offset (the one counted copy of an output not already in the arena) and describe it
    in ``descs[key]``; return the bytes written. Process workers and Ray actors share it."""
    copied = 0
    for (d, key, arr, n), off in zip(pending, offsets, strict=True):
        dst = view[off : off + n]
        if arr.dtype == object:
            write_bytes_tensor(list(arr), dst)
            d[key] = TensorDesc(off, n, BYTES, (len(arr),))
        else:
            if n:
                flat = np.ascontiguousarray(arr).reshape(-1).view(np.uint8)
                np.frombuffer(dst, dtype=np.uint8)[:] = flat
            d[key] = TensorDesc(off, n, arr.dtype.str, arr.shape)
        copied += n
    return copied
