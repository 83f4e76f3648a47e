"""Small real models for the Ray suite. Module-level, so Ray actors import them by name;
cross-process observation goes through files named in the model options (an actor runs
in a process the test did not spawn, so it cannot share an Event with it)."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

import numpy as np

from zeroserve.models.base import GenerateRequest, Inputs, Model, Outputs, Piece

# A model waiting for the test to act never waits longer than this (no test hangs).
WAIT_LIMIT_S = 60.0
POLL_S = 0.005


class Doubler(Model):
    """``infer`` returns ``y = 2 * x``: an output that is not in the arena yet."""

    def infer(self, batch: Sequence[Inputs]) -> Sequence[Outputs]:
        return [{"y": np.asarray(item["x"]) * 2} for item in batch]


class Recorded(Model):
    """``infer`` returns ``y = 2 * x``; ``load`` appends its process's pid to the file
    ``pids``, so a test knows every process that has held the model."""

    def __init__(self, pids: str = "") -> None:
        super().__init__()
        self.pids = Path(pids)

    def load(self) -> None:
        with self.pids.open("a") as f:
            f.write(f"{os.getpid()}\n")

    def infer(self, batch: Sequence[Inputs]) -> Sequence[Outputs]:
        return [{"y": np.asarray(item["x"]) * 2} for item in batch]


class Stuck(Model):
    """``infer`` writes its process's pid to ``started`` then waits (bounded) for
    ``release`` to exist; ``generate`` yields one piece then does the same. ``load``
    waits (bounded) while ``hold`` exists: a replacement that starts only when told."""

    def __init__(self, started: str = "", release: str = "", hold: str = "") -> None:
        super().__init__()
        self.started, self.release = Path(started), Path(release)
        self.hold = Path(hold) if hold else None

    def load(self) -> None:
        deadline = time.monotonic() + WAIT_LIMIT_S
        while self.hold is not None and self.hold.exists() and time.monotonic() < deadline:
            time.sleep(POLL_S)

    def _wait(self) -> None:
        self.started.write_text(str(os.getpid()))
        deadline = time.monotonic() + WAIT_LIMIT_S
        while not self.release.exists() and time.monotonic() < deadline:
            time.sleep(POLL_S)

    def infer(self, batch: Sequence[Inputs]) -> Sequence[Outputs]:
        self._wait()
        return [dict(item) for item in batch]

    def generate(self, req: GenerateRequest) -> Iterator[Piece]:
        yield "first"
        self._wait()
        yield "second"


class Ticker(Model):
    """``generate`` yields "0", "1", ... forever; once closed, it writes how many pieces it
    produced to ``closed``."""

    def __init__(self, closed: str = "") -> None:
        super().__init__()
        self.closed = Path(closed)

    def generate(self, req: GenerateRequest) -> Iterator[Piece]:
        i = 0
        try:
            while True:
                yield f"{i} "
                i += 1
                time.sleep(0.001)
        finally:
            self.closed.write_text(str(i))


class Slow(Model):
    """``infer`` echoes its inputs after ``delay_ms`` of (sleeping) work: a request that
    stays in flight long enough for Serve's autoscaler to count it."""

    def __init__(self, delay_ms: int = 200) -> None:
        super().__init__()
        self.delay_s = min(delay_ms / 1000, WAIT_LIMIT_S)

    def infer(self, batch: Sequence[Inputs]) -> Sequence[Outputs]:
        time.sleep(self.delay_s)
        return [dict(item) for item in batch]


class Overlap(Model):
    """``infer`` works ``delay_ms`` (sleeping) and answers, as its ``raw`` output, how
    many ``infer`` calls of this model were running at once while it ran: ``b"1"`` when
    its batches come one at a time."""

    def __init__(self, delay_ms: int = 20) -> None:
        super().__init__()
        self.delay_s = min(delay_ms / 1000, WAIT_LIMIT_S)
        self.running = 0
        self.lock = threading.Lock()

    def infer(self, batch: Sequence[Inputs]) -> Sequence[Outputs]:
        with self.lock:
            self.running += 1
            seen = self.running
        time.sleep(self.delay_s)
        with self.lock:
            seen = max(seen, self.running)
            self.running -= 1
        return [{"raw": np.frombuffer(str(seen).encode(), dtype=np.uint8)} for _ in batch]
