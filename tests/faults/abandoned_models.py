"""A process model whose calls hang until its worker is killed, for
tests/faults/test_abandoned.py (a real ``zeroserve serve``; its workers import this
module by name).

It tells the test what it does through ``marks``, a file it appends one line to per
event ("load", "hung"), and every load after the first (a respawn) waits until the test
writes a byte to ``hold``, a FIFO: the test sees the model while no worker is up. No
``multiprocessing`` Event: the worker that waits is killed.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator, Sequence

from zeroserve.models.base import GenerateRequest, Inputs, Model, Outputs


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
