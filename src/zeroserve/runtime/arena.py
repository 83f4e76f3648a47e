"""The shared-memory arena: every request body and model output lives in one of its leases.

Strategy
--------
One ``memfd_create`` file, mapped once (``MAP_SHARED``) in the server and again in each
worker process, which receives the file descriptor at spawn. Being an anonymous file, a
crash leaves nothing behind in ``/dev/shm``. The mapping is *sparse*: address space is
reserved up front (``VIRTUAL_FACTOR`` x the budget) and pages are only backed once touched.

Blocks come in size classes: powers of two split into four steps (like jemalloc's), so
internal waste is at most 25 %. A freed block goes to its class's LIFO free list, so the
next request of that size reuses warm pages instead of faulting fresh ones (a fresh 8 MiB
buffer per request costs more in page faults than in copying). Free blocks beyond
``warm_bytes`` in total are handed back to the kernel with ``MADV_REMOVE`` but keep their
address range, so RSS falls back after a burst.

Invariants
----------
* ``used`` is the sum of the class sizes of live leases and never exceeds ``budget``;
  ``allocate`` raises ``Overloaded(503)`` instead (admission by bytes in flight).
* A lease returns its block exactly once, when its reference count reaches zero. Holders
  that keep a view beyond their own scope (a transport still sending from it, a worker
  reading it) ``retain()`` first and ``release()`` when done.
* The arena is used from the event-loop thread and from executor threads; a lock guards
  the free lists (never held across I/O).
* Live leases are indexed by offset (``lease_containing``), so memory handed back by a
  worker or a model as a bare address range is tied to the lease that owns it.
"""

from __future__ import annotations

import bisect
import ctypes
import mmap
import os
import threading
from dataclasses import dataclass

from ..errors import Overloaded

# 1 GiB of payload in flight by default: 32 concurrent 8 MiB bodies plus their outputs
# fit four times over on a 24 GiB machine, while a flood of 1 MiB bodies is still refused
# (503) long before the machine swaps.
DEFAULT_BUDGET_BYTES = 1 << 30
# Address space reserved per budget byte. Blocks are never coalesced, so a workload whose
# sizes shift leaves free blocks of the old classes behind; 8x leaves room for that. It is
# address space only: unmapped pages cost nothing.
VIRTUAL_FACTOR = 8
# Free blocks kept backed by memory for reuse. Beyond this, freed blocks are MADV_REMOVEd.
DEFAULT_WARM_BYTES = 256 << 20
# Smallest block: small bodies (JSON requests) share no page-sized waste worth fighting.
MIN_BLOCK = 256
_ALIGN = 64  # cache-line alignment of every block start, good for numpy views
# Random bytes written to the memfd just past the mapped range, so a process that opens
# the file by another route (``/proc/<pid>/fd/<fd>``, the Ray executor) can prove it
# holds this arena and not a stale or foreign file. 16 bytes: unguessable.
TOKEN_BYTES = 16


def size_class(nbytes: int) -> int:
    """The block size used for a request of ``nbytes``: 2^k x {1, 1.25, 1.5, 1.75}."""
    n = max(nbytes, MIN_BLOCK)
    top = 1 << (n - 1).bit_length()  # next power of two >= n
    base = top >> 1
    step = base >> 2
    for k in (1, 2, 3):
        if n <= base + k * step:
            return base + k * step
    return top


@dataclass(frozen=True, slots=True)
class ArenaStatistics:
    budget: int
    used: int
    peak: int
    leases: int
    warm: int
    allocations: int


class Lease:
    """A reference-counted block of the arena holding exactly ``length`` payload bytes."""

    __slots__ = ("_arena", "_refs", "block", "length", "offset", "view")

    def __init__(self, arena: Arena, offset: int, block: int, length: int) -> None:
        self._arena = arena
        self.offset = offset
        self.block = block
        self.length = length
        self.view: memoryview = arena.view[offset : offset + length]
        self._refs = 1

    def retain(self) -> Lease:
        with self._arena._lock:
            if self._refs <= 0:
                raise RuntimeError("retain() on a released lease")
            self._refs += 1
        return self

    def release(self) -> None:
        arena = self._arena
        with arena._lock:
            self._refs -= 1
            if self._refs > 0:
                return
            if self._refs < 0:
                raise RuntimeError("lease released more times than retained")
            arena._free_locked(self.offset, self.block)

    def shrink(self, length: int) -> None:
        """Narrow the payload to its first ``length`` bytes (e.g. a worker's actual output)."""
        if length > self.block:
            raise ValueError("shrink() beyond the block")
        self.length = length
        self.view = self._arena.view[self.offset : self.offset + length]

    @property
    def released(self) -> bool:
        return self._refs <= 0

    def __repr__(self) -> str:
        return f"<Lease offset={self.offset} length={self.length} refs={self._refs}>"


class Arena:
    """A memfd-backed, size-classed allocator of shared-memory leases."""

    def __init__(
        self,
        budget: int = DEFAULT_BUDGET_BYTES,
        *,
        warm_bytes: int = DEFAULT_WARM_BYTES,
        name: str = "zeroserve-arena",
    ) -> None:
        if budget <= 0:
            raise ValueError("arena budget must be positive")
        self.budget = budget
        self.warm_limit = warm_bytes
        self.size = _round_up(budget * VIRTUAL_FACTOR, mmap.PAGESIZE)
        self.fd = os.memfd_create(name, os.MFD_CLOEXEC)
        # One page past the mapping holds the token (never mapped, never allocated).
        os.ftruncate(self.fd, self.size + mmap.PAGESIZE)
        self.token = os.urandom(TOKEN_BYTES)
        os.pwrite(self.fd, self.token, self.size)
        self._mm = mmap.mmap(self.fd, self.size, flags=mmap.MAP_SHARED)
        self.view = memoryview(self._mm)
        # The mapping's address, to tell whether an array is a view into the arena. The
        # ctypes export is dropped at once so close() can still unmap.
        probe = ctypes.c_char.from_buffer(self._mm)
        self.address: int = ctypes.addressof(probe)
        del probe
        self._live: dict[int, Lease] = {}
        self._starts: list[int] = []
        self._lock = threading.Lock()
        self._free: dict[int, list[int]] = {}
        self._top = 0
        self._used = 0
        self._peak = 0
        self._leases = 0
        self._warm = 0
        self._allocations = 0
        self._closed = False

    def allocate(self, nbytes: int) -> Lease:
        """A lease of exactly ``nbytes`` payload bytes. Raises ``Overloaded(503)`` when the
        budget of bytes in flight would be exceeded."""
        block = size_class(nbytes)
        with self._lock:
            if self._closed:
                raise RuntimeError("arena is closed")
            if self._used + block > self.budget:
                raise Overloaded("server is at its limit of payload bytes in flight", status=503)
            free = self._free.get(block)
            if free:
                offset = free.pop()
                self._warm -= block
            else:
                offset = self._top
                if offset + block > self.size:
                    raise Overloaded("shared-memory arena is fragmented", status=503)
                self._top = offset + _round_up(block, _ALIGN)
            self._used += block
            self._leases += 1
            self._allocations += 1
            if self._used > self._peak:
                self._peak = self._used
            lease = Lease(self, offset, block, nbytes)
            self._live[offset] = lease
            bisect.insort(self._starts, offset)
        return lease

    def lease_containing(self, offset: int, length: int = 0) -> Lease | None:
        """The live lease whose block holds ``[offset, offset + length)``, if any."""
        with self._lock:
            i = bisect.bisect_right(self._starts, offset) - 1
            if i < 0:
                return None
            lease = self._live[self._starts[i]]
            if offset + length <= lease.offset + lease.block:
                return lease
            return None

    def _free_locked(self, offset: int, block: int) -> None:
        self._used -= block
        self._leases -= 1
        del self._live[offset]
        del self._starts[bisect.bisect_left(self._starts, offset)]
        if self._closed:
            return
        if self._warm + block > self.warm_limit and block >= mmap.PAGESIZE:
            # Give the pages back; keep the address range for a later allocation.
            start = _round_up(offset, mmap.PAGESIZE)
            end = (offset + block) & ~(mmap.PAGESIZE - 1)
            if end > start:
                self._mm.madvise(mmap.MADV_REMOVE, start, end - start)
        else:
            self._warm += block
        self._free.setdefault(block, []).append(offset)

    def statistics(self) -> ArenaStatistics:
        with self._lock:
            return ArenaStatistics(
                budget=self.budget,
                used=self._used,
                peak=self._peak,
                leases=self._leases,
                warm=self._warm,
                allocations=self._allocations,
            )

    def close(self) -> None:
        """Unmap and close. Leases still alive keep their views valid until collected."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        # Slices of the root view may still be alive (a lease someone forgot), so the
        # mapping is closed only if nothing exports it; otherwise it dies with them.
        try:
            self._mm.close()
        except BufferError:
            pass
        os.close(self.fd)


def read_token(fd: int, size: int) -> bytes:
    """The token of the arena file ``fd`` of mapped size ``size`` (see ``TOKEN_BYTES``)."""
    return os.pread(fd, TOKEN_BYTES, size)


def attach(fd: int, size: int) -> memoryview:
    """Map an arena received by file descriptor (in a worker process)."""
    mm = mmap.mmap(fd, size, flags=mmap.MAP_SHARED)
    return memoryview(mm)


def _round_up(n: int, align: int) -> int:
    return (n + align - 1) // align * align
