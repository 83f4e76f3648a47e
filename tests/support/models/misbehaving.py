"""Models that misbehave on purpose, for the faults suite: they stall (deadlines), hang
the thread or process running them, or crash their worker."""

from __future__ import annotations

import asyncio
import os
import threading
import time
from collections.abc import AsyncIterator, Iterator, Sequence

import numpy as np

from zeroserve.models.base import GenerateRequest, Inputs, Model, Outputs


class StallModel(Model):
    """Every call waits forever (until its deadline or the client gives up)."""

    executor = "inline"

    async def infer(self, batch: Sequence[Inputs]) -> list[Outputs]:
        await asyncio.Event().wait()
        return []

    async def generate(self, req: GenerateRequest) -> AsyncIterator[str]:
        await asyncio.Event().wait()
        yield "never"

    async def embed(self, texts: Sequence[str]) -> np.ndarray:
        await asyncio.Event().wait()
        return np.empty((0, 1), dtype=np.float32)


class SlowStartModel(Model):
    """Streams one piece at once, then stalls: a deadline must end the stream with an
    error event after its head was sent."""

    executor = "inline"

    async def generate(self, req: GenerateRequest) -> AsyncIterator[str]:
        yield "first"
        await asyncio.Event().wait()
        yield "never"


# Released by the test to let every hung thread-executor call return.
RELEASE = threading.Event()
# A hung call never waits longer than this (a failing test must not leave threads behind).
HANG_LIMIT_S = 60.0


class HangThreadModel(Model):
    """Raw/V2 echo on the thread executor; a body of ``hang`` blocks its thread until
    ``RELEASE`` is set."""

    executor = "thread"
    workers = 2

    def infer(self, batch: Sequence[Inputs]) -> list[Outputs]:
        for inputs in batch:
            if bytes(inputs.get("raw", b"")) == b"hang":
                RELEASE.wait(HANG_LIMIT_S)
        return [dict(inputs) for inputs in batch]


class HangEagerThreadModel(Model):
    """Generation on the thread executor by a plain function (not a generator): its work,
    which a prompt of ``hang`` blocks until ``RELEASE`` is set, happens in the call,
    before the first piece."""

    executor = "thread"
    workers = 2

    def generate(self, req: GenerateRequest) -> Iterator[str]:
        if req.prompt == "hang":
            RELEASE.wait(HANG_LIMIT_S)
        return iter(["first", " done"])


class HangStreamThreadModel(Model):
    """Generation on the thread executor: yields ``"first"``, then a prompt of ``hang``
    blocks that step's thread until ``RELEASE`` is set; any other prompt ends at once."""

    executor = "thread"
    workers = 2

    def generate(self, req: GenerateRequest) -> Iterator[str]:
        yield "first"
        if req.prompt == "hang":
            RELEASE.wait(HANG_LIMIT_S)
        yield " done"


class HangProcessModel(Model):
    """Raw echo in a process worker; a body of ``hang`` blocks forever (until the worker
    is killed), ``crash`` kills the worker mid-batch. Generation yields one piece every
    10 ms for the stream that is cut by a kill; a prompt of ``hang`` yields ``"first"``
    and then blocks its step forever."""

    executor = "process"
    workers = 1
    max_batch_size = 4
    max_batch_delay_ms = 20.0

    def infer(self, batch: Sequence[Inputs]) -> list[Outputs]:
        for inputs in batch:
            body = bytes(inputs.get("raw", b""))
            if body == b"hang":
                threading.Event().wait()
            if body == b"crash":
                os._exit(3)
        return [dict(inputs) for inputs in batch]

    def generate(self, req: GenerateRequest) -> Iterator[str]:
        if req.prompt == "hang":
            yield "first"
            threading.Event().wait()
        for i in range(req.max_tokens or 1000):
            time.sleep(0.01)
            yield f"p{i} "
