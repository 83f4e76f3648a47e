"""A model whose progress a batch test controls, across processes and restarts: each
generation logs that it started, then blocks reading one byte from a FIFO (the gate)
that the test writes to, then logs that it finished. The directory is
``ZEROSERVE_TEST_BATCH_GATE``; nothing sleeps."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import ClassVar

from zeroserve.models.base import GenerateRequest, Model

GATE_ENV = "ZEROSERVE_TEST_BATCH_GATE"


def log_line(path: Path, text: str) -> None:
    """Append one line with one write (the log survives a SIGKILL line by line)."""
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        os.write(fd, (text.replace("\n", " ") + "\n").encode())
    finally:
        os.close(fd)


class PipeGated(Model):
    """Answers ``done`` once the test lets one byte through ``$GATE/gate``; logs the
    prompt's last word to ``$GATE/started`` before and ``$GATE/finished`` after."""

    executor = "thread"
    description: ClassVar[str] = "test model: one generation per byte the test writes"

    def load(self) -> None:
        self.dir = Path(os.environ[GATE_ENV])

    def generate(self, req: GenerateRequest) -> Iterator[str]:
        word = req.prompt.split()[-1] if req.prompt.split() else ""
        log_line(self.dir / "started", word)
        fd = os.open(self.dir / "gate", os.O_RDONLY)
        try:
            os.read(fd, 1)
        finally:
            os.close(fd)
        log_line(self.dir / "finished", word)
        yield "done"
