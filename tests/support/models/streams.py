"""Streams a test steers: a gate it controls, an endless stream whose close it can observe,
one that fails mid-stream. (The model that stalls is ``misbehaving.StallModel``.)"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import ClassVar

from tests.support.timing import scaled
from zeroserve.models.base import GenerateRequest, Model

# A test waits on this (with a timeout) to know that an endless generation was closed.
CLOSED = threading.Semaphore(0)
# Gates by prompt: GatedModel yields its first piece, then waits for the gate to open.
GATES: dict[str, threading.Event] = {}
# Seconds (quiet machine, scaled) a gated generation waits before giving up: a failing test
# must not hang.
GATE_TIMEOUT_S = 30.0


class GatedModel(Model):
    """Completions prompt ``key``: yields ``"t0"``, waits for ``GATES[key]``, then
    yields ``" t1"`` ... up to ``max_tokens`` pieces in all."""

    executor = "thread"
    description: ClassVar[str] = "test model: a stream the test releases"

    def generate(self, req: GenerateRequest) -> Iterator[str]:
        total = req.max_tokens or 1
        yield "t0"
        GATES[req.prompt].wait(scaled(GATE_TIMEOUT_S))
        for i in range(1, total):
            yield f" t{i}"


class EndlessModel(Model):
    """Yields ``"x "`` up to ``max_tokens`` times, forever without a limit; signals
    ``CLOSED`` when its generator is closed before its end."""

    executor = "inline"

    def generate(self, req: GenerateRequest) -> Iterator[str]:
        produced = 0
        try:
            while req.max_tokens is None or produced < req.max_tokens:
                yield "x "
                produced += 1
        except GeneratorExit:
            CLOSED.release()
            raise


class GatedTokensModel(GatedModel):
    """:class:`GatedModel` with a tokenizer: a text's UTF-8 bytes are its tokens."""

    def tokenize(self, text: str, add_special_tokens: bool) -> list[int]:
        return list(text.encode())

    def detokenize(self, tokens: list[int]) -> str:
        if any(not 0 <= t < 256 for t in tokens):
            raise ValueError("a token is a byte: 0..255")
        return bytes(tokens).decode(errors="replace")


class FailingModel(Model):
    """Two pieces, then a model error."""

    executor = "inline"

    def generate(self, req: GenerateRequest) -> Iterator[str]:
        yield "one"
        yield " two"
        raise ValueError("the model broke")
