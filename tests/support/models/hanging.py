"""Models whose work hangs until released or killed, for the abandoned-work suites
(tests/runtime/test_abandoned.py in-process, tests/faults/test_abandoned.py through a real
``zeroserve serve``). Module-level, so spawned process workers import them by name.

A process worker that hangs is killed, so no model here waits on a ``multiprocessing``
Event: a killed waiter stays counted in the Event's condition, and a later ``set()``
blocks forever. A process model signals through a ``multiprocessing`` Value (updated
and released at once, never held while hanging) or a file it appends to, and is held
at load by a FIFO the test writes to.

``HangOnRequest`` tells its test what it does through ``marks``, a file it appends one
line to per event ("load", "hung"); every load after the first (a respawn) waits until
the test writes a byte to ``hold``: the test sees the model while no worker is up.
"""

from __future__ import annotations

import asyncio
import os
import threading
from collections.abc import AsyncIterator, Iterator, Sequence
from typing import Any

from zeroserve.models.base import GenerateRequest, Inputs, Model, Outputs, Piece


def _count(value: Any) -> None:
    if value is not None:
        with value.get_lock():
            value.value += 1


class HangingWorker(Model):
    """Process model. ``infer`` echoes its inputs, or (an input named ``hang``) never
    returns; ``generate`` yields "first" and then, for the prompt "hang", never returns
    from its next step. ``started`` counts the calls that began.

    ``hold`` (a FIFO's path): every load after the first (a respawn) waits until the test
    writes a byte to it, so the test sees the model while no worker is up; ``starts``
    counts the loads that began."""

    def __init__(self, started: Any = None, starts: Any = None, hold: str = "") -> None:
        super().__init__()
        self.started, self.starts, self.hold = started, starts, hold

    def load(self) -> None:
        first = True
        if self.starts is not None:
            with self.starts.get_lock():
                first = self.starts.value == 0
                self.starts.value += 1
        if self.hold and not first:
            fd = os.open(self.hold, os.O_RDONLY)  # blocks until the test opens it to write
            try:
                os.read(fd, 1)
            finally:
                os.close(fd)

    def infer(self, batch: Sequence[Inputs]) -> Sequence[Outputs]:
        _count(self.started)
        if any("hang" in x for x in batch):
            threading.Event().wait()
        return [dict(x) for x in batch]

    def generate(self, req: GenerateRequest) -> Iterator[Piece]:
        _count(self.started)
        yield "first"
        if req.prompt == "hang":
            threading.Event().wait()
        yield "done"


class HangingThread(Model):
    """Thread model: ``infer`` (an input named ``hang``) and the second step of
    ``generate`` (prompt "hang") block until ``release`` is set; ``started`` is set once
    such a call began."""

    def __init__(
        self, release: threading.Event | None = None, started: threading.Event | None = None
    ) -> None:
        super().__init__()
        self.release = release or threading.Event()
        self.started = started or threading.Event()

    def infer(self, batch: Sequence[Inputs]) -> Sequence[Outputs]:
        if any("hang" in x for x in batch):
            self.started.set()
            self.release.wait()
        return [dict(x) for x in batch]

    def generate(self, req: GenerateRequest) -> Iterator[Piece]:
        yield "first"
        if req.prompt == "hang":
            self.started.set()
            self.release.wait()
        yield "done"


class HangingAsync(Model):
    """Inline model: an async ``infer`` (an input named ``hang``) and ``generate`` that
    wait forever on the loop, ``started`` counting their calls."""

    def __init__(self, started: list[int] | None = None) -> None:
        super().__init__()
        self.started = started if started is not None else [0]

    async def infer(self, batch: Sequence[Inputs]) -> Sequence[Outputs]:
        self.started[0] += 1
        if any("hang" in x for x in batch):
            await asyncio.Event().wait()
        return [dict(x) for x in batch]

    async def generate(self, req: GenerateRequest) -> AsyncIterator[Piece]:
        self.started[0] += 1
        yield "first"
        if req.prompt == "hang":
            await asyncio.Event().wait()
        yield "done"


class HangOnRequest(Model):
    """Raw echo in one process worker; a body of ``hang`` never returns, and a stream
    with the prompt ``hang`` yields "first" and then never returns from its step."""

    executor = "process"
    workers = 1
    max_batch_size = 1

    def __init__(self, marks: str = "", hold: str = "") -> None:
        super().__init__()
        self.marks, self.hold = marks, hold

    def _mark(self, event: str) -> None:
        with open(self.marks, "a") as f:
            f.write(event + "\n")

    def load(self) -> None:
        respawn = os.path.exists(self.marks)
        self._mark("load")
        if respawn:
            fd = os.open(self.hold, os.O_RDONLY)  # until the test opens it to write
            try:
                os.read(fd, 1)
            finally:
                os.close(fd)

    def infer(self, batch: Sequence[Inputs]) -> list[Outputs]:
        for inputs in batch:
            if bytes(inputs.get("raw", b"")) == b"hang":
                self._mark("hung")
                threading.Event().wait()
        return [dict(inputs) for inputs in batch]

    def generate(self, req: GenerateRequest) -> Iterator[str]:
        yield "first"
        if req.prompt == "hang":
            self._mark("hung")
            threading.Event().wait()
        yield " done"
