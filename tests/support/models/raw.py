"""Small real models used by the server tests (importable by spawned workers)."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

from zeroserve import Model
from zeroserve.models.base import GenerateRequest, Inputs, Outputs


class Reverse(Model):
    """Returns the raw body reversed (a new buffer, unlike echo)."""

    def infer(self, batch: Sequence[Inputs]) -> Sequence[Outputs]:
        return [{"raw": inputs["raw"][::-1].copy()} for inputs in batch]


class FailsToLoad(Model):
    def load(self) -> None:
        raise FileNotFoundError("weights missing: /nonexistent/model.bin")

    def infer(self, batch: Sequence[Inputs]) -> Sequence[Outputs]:
        return list(batch)


class EmbedOnly(Model):
    """Has no raw capability: the raw endpoint must refuse it with 400."""

    def embed(self, texts: Sequence[str]) -> Any:
        import numpy as np

        return np.zeros((len(texts), 4), dtype=np.float32)


class Lines(Model):
    """Streams pieces with line breaks among plain ones (SSE needs a data: line each)."""

    def generate(self, req: GenerateRequest) -> Iterator[str]:
        for i in range(20):
            yield f"l{i}\nnext" if i % 7 == 3 else f"p{i}"


class Endless(Model):
    """Streams ``b"x"`` pieces until the client goes away, counting every piece made by
    any of its streams; a stream whose body is ``b"new"`` notes the count when it starts
    (the fairness test reads how much the other streams made in between)."""

    executor = "inline"
    made = 0  # pieces made so far, by every stream
    new_started_at: int | None = None  # ``made`` when the stream of ``b"new"`` started

    def generate(self, req: GenerateRequest) -> Iterator[bytes]:
        if req.raw is not None and bytes(req.raw) == b"new":
            Endless.new_started_at = Endless.made
        while True:
            Endless.made += 1
            yield b"x"
