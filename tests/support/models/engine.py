"""Small real models for the runtime suite. Module-level, so spawned workers import them.

Cross-process observation uses ``multiprocessing`` (spawn) Events and Values passed in
the model options: they are pickled to workers when the worker is spawned.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator, Iterator, Sequence
from typing import Any

import numpy as np

from zeroserve.models.base import GenerateRequest, Inputs, Model, Outputs, Piece
from zeroserve.models.echo import EchoModel


class Echo(EchoModel):
    """The built-in echo model, every capability."""


class Gate(Model):
    """``infer`` counts its requests in ``started`` and waits until ``gate`` is set.

    Async, so it can wait on every executor without blocking the loop it runs on.
    """

    def __init__(self, gate: Any = None, started: Any = None, finished: Any = None) -> None:
        super().__init__()
        self.gate, self.started, self.finished = gate, started, finished

    async def infer(self, batch: Sequence[Inputs]) -> Sequence[Outputs]:
        with self.started.get_lock():
            self.started.value += len(batch)
        while not self.gate.is_set():
            await asyncio.sleep(0.001)
        with self.finished.get_lock():
            self.finished.value += len(batch)
        return [dict(x) for x in batch]


class BatchProbe(Model):
    """``infer`` doubles ``x`` and reports the size of the batch it was part of."""

    def infer(self, batch: Sequence[Inputs]) -> Sequence[Outputs]:
        return [
            {"y": np.asarray(x["x"]) * 2, "batch": np.array([len(batch)], dtype=np.int64)}
            for x in batch
        ]


class Counter(Model):
    """``generate`` yields "0", "1", ... (until ``max_tokens``), counting each piece in
    ``produced`` and setting ``closed`` once the generator is closed."""

    def __init__(self, produced: Any = None, closed: Any = None) -> None:
        super().__init__()
        self.produced, self.closed = produced, closed

    def generate(self, req: GenerateRequest) -> Iterator[Piece]:
        i = 0
        try:
            while req.max_tokens is None or i < req.max_tokens:
                with self.produced.get_lock():
                    self.produced.value += 1
                yield str(i)
                i += 1
        finally:
            self.closed.set()


class AsyncCounter(Counter):
    async def generate(self, req: GenerateRequest) -> AsyncIterator[Piece]:  # type: ignore[override]
        i = 0
        try:
            while req.max_tokens is None or i < req.max_tokens:
                with self.produced.get_lock():
                    self.produced.value += 1
                yield str(i)
                i += 1
                await asyncio.sleep(0)
        finally:
            self.closed.set()


class Flood(Model):
    """``generate`` yields 1 KiB text pieces forever: a producer far faster than a reader."""

    def generate(self, req: GenerateRequest) -> Iterator[Piece]:
        piece = "x" * 1024
        while True:
            yield piece


class Faulty(Model):
    """``infer`` raises for an input named ``boom``, exits the process for ``crash``."""

    def infer(self, batch: Sequence[Inputs]) -> Sequence[Outputs]:
        for x in batch:
            if "crash" in x:
                os._exit(3)
            if "boom" in x:
                raise ValueError("boom requested")
        return [dict(x) for x in batch]

    def generate(self, req: GenerateRequest) -> Iterator[Piece]:
        yield "one"
        if req.prompt.startswith("crash:"):
            # Exits once the test, holding "one", writes to the FIFO named after the colon:
            # the piece is out before the crash, whatever the machine's speed.
            with open(req.prompt.removeprefix("crash:"), "rb") as hold:
                hold.read(1)
            os._exit(4)
        raise ValueError("generation failed")


class BrokenLoad(Model):
    def load(self) -> None:
        raise RuntimeError("weights file is missing")

    def infer(self, batch: Sequence[Inputs]) -> Sequence[Outputs]:
        return list(batch)


class MissingWeights(Model):
    """``load`` fails as a missing file does: the error names the server path ``path``."""

    def __init__(self, path: str = "/srv/private/models/weights.bin") -> None:
        super().__init__()
        self.path = path

    def load(self) -> None:
        raise FileNotFoundError(f"[Errno 2] No such file or directory: {self.path!r}")

    def infer(self, batch: Sequence[Inputs]) -> Sequence[Outputs]:
        return list(batch)


class Ballast(Model):
    """Holds ``mib`` MiB of written memory from ``load`` until the model is dropped."""

    def __init__(self, mib: int = 64) -> None:
        super().__init__()
        self.mib = int(mib)
        self.ballast: np.ndarray[Any, Any] | None = None

    def load(self) -> None:
        self.ballast = np.ones(self.mib << 20, dtype=np.uint8)  # every page touched

    def infer(self, batch: Sequence[Inputs]) -> Sequence[Outputs]:
        return list(batch)


class FileBallast(Ballast):
    """A ``Ballast`` whose size each ``load`` reads from the file ``path`` (MiB), so a
    worker started again can hold more than the one before."""

    def __init__(self, path: str) -> None:
        super().__init__()
        self.path = path

    def load(self) -> None:
        with open(self.path) as f:
            self.mib = int(f.read())
        super().load()


class Finisher(Model):
    """Yields the prompt's words and returns why it stopped, like a real LLM's generate."""

    def generate(self, req: GenerateRequest) -> Iterator[Piece]:  # type: ignore[override]
        words = req.prompt.split()
        for i, word in enumerate(words):
            if req.max_tokens is not None and i >= req.max_tokens:
                return "length"
            yield word
        return "stop"


class Turnstile(Model):
    """``infer`` writes each request's ``x`` into ``order`` (a shared array) in the order
    the model runs them, then waits until the test has let that many through
    (``passed``): the test decides when each call ends, so the order of the calls is
    the order the runtime chose. Async, so it waits on every executor without blocking
    the loop it runs on."""

    def __init__(self, order: Any = None, seen: Any = None, passed: Any = None) -> None:
        super().__init__()
        self.order, self.seen, self.passed = order, seen, passed

    async def infer(self, batch: Sequence[Inputs]) -> Sequence[Outputs]:
        for x in batch:
            with self.seen.get_lock():
                self.order[self.seen.value] = int(np.asarray(x["x"])[0])
                self.seen.value += 1
        mine = self.seen.value
        while self.passed.value < mine:
            await asyncio.sleep(0.001)
        return [dict(x) for x in batch]


class TurnstileEmbedder(Turnstile):
    """A :class:`Turnstile` that also embeds: ``embed`` records ``int(text)`` for each
    text in the same ``order`` and waits for ``passed`` the same way, so its infer and
    embed batchers contend for the one worker in an order the test reads."""

    async def embed(self, texts: Sequence[str]) -> np.ndarray:
        await self.infer([{"x": np.array([int(t)])} for t in texts])
        return np.zeros((len(texts), 2), dtype=np.float32)


class Versioned(Model):
    """A model that says which version and process serve it: ``generate`` yields
    ``"<version>@<pid> "``, then, once the file ``hold`` exists (at once without one),
    ``"done"``; ``infer`` answers ``raw`` with the same ``"<version>@<pid>"`` bytes.
    Async, so a held stream waits on every executor without blocking its loop."""

    def __init__(self, version: str = "v1", hold: str = "") -> None:
        super().__init__()
        self.version, self.hold = str(version), hold

    def _tag(self) -> str:
        return f"{self.version}@{os.getpid()}"

    def infer(self, batch: Sequence[Inputs]) -> Sequence[Outputs]:
        tag = np.frombuffer(self._tag().encode(), dtype=np.uint8)
        return [{"raw": tag} for _ in batch]

    async def generate(self, req: GenerateRequest) -> AsyncIterator[Piece]:  # type: ignore[override]
        yield self._tag() + " "
        while self.hold and not os.path.exists(self.hold):
            await asyncio.sleep(0.001)
        yield "done"
