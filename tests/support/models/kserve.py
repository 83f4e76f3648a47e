"""Models for the KServe suite, importable by name (``tests.support.models.kserve:Probe``)
so that spawned process workers can load them."""

from __future__ import annotations

import ctypes
import mmap
from collections.abc import Sequence
from typing import Any

import numpy as np

from zeroserve.models.base import Inputs, Model, Outputs


def in_shared_mapping(arr: np.ndarray) -> bool:
    """Whether ``arr`` is a view (no copy) into a memory-mapped buffer, i.e. the arena."""
    base: Any = arr
    while isinstance(base, np.ndarray) and base.base is not None:
        base = base.base
    if isinstance(base, memoryview):
        base = base.obj
    if not isinstance(base, mmap.mmap) or not arr.nbytes:
        return False
    probe = ctypes.c_char.from_buffer(base)
    start = ctypes.addressof(probe)
    del probe
    addr = int(arr.ctypes.data)
    return start <= addr and addr + arr.nbytes <= start + len(base)


class Probe(Model):
    """Identity, plus for each numeric input ``X`` an output ``X__shared`` (BOOL [1]): did
    the model receive ``X`` as a view into the shared-memory arena. The request parameters
    the KServe layer passes come back as the output ``params_seen``."""

    max_batch_size = 1

    def infer(self, batch: Sequence[Inputs]) -> Sequence[Outputs]:
        results = []
        for inputs in batch:
            out: dict[str, Any] = {}
            for name, value in inputs.items():
                if name == "__parameters__":
                    out["params_seen"] = value
                    continue
                out[name] = value
                if value.dtype != object:
                    out[name + "__shared"] = np.array([in_shared_mapping(value)])
            results.append(out)
        return results


class Gate(Model):
    """Async identity that holds each request until the file ``<flag>.go`` exists, after
    creating ``<flag>.started``: lets a test fill the model's queue deterministically."""

    def __init__(self, flag: str = "") -> None:
        super().__init__(flag=flag)
        self.flag = flag

    async def infer(self, batch: Sequence[Inputs]) -> Sequence[Outputs]:
        import asyncio
        import os

        open(self.flag + ".started", "w").close()
        while not os.path.exists(self.flag + ".go"):
            await asyncio.sleep(0.005)
        return [dict(inputs) for inputs in batch]
