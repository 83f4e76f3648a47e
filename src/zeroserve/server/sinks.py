"""Body sinks: where the I/O layer has a chunked request body decoded to."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .. import metrics


class LeaseSink:
    """Receives a decoded chunked body into a growing arena lease (the one counted copy)."""

    __slots__ = ("_alloc", "lease", "size")

    # First lease for a chunked body, bytes; doubled (one counted copy) when outgrown.
    INITIAL = 64 * 1024

    def __init__(self, allocate: Callable[[int], Any]) -> None:
        self._alloc = allocate
        self.lease = allocate(self.INITIAL)
        self.size = 0

    def write(self, data: memoryview) -> None:
        n = len(data)
        end = self.size + n
        if end > self.lease.length:
            bigger = self._alloc(max(end, 2 * self.lease.length))
            bigger.view[: self.size] = self.lease.view[: self.size]
            metrics.count_copy("chunked_grow", self.size)
            self.lease.release()
            self.lease = bigger
        self.lease.view[self.size : end] = data
        self.size = end
        metrics.count_copy("chunked", n)

    def finish(self) -> Any:
        self.lease.shrink(self.size)
        return self.lease
