"""Small real models used by the server tests (importable by spawned workers)."""

from __future__ import annotations

from collections.abc import Sequence

from zeroserve import Model
from zeroserve.models.base import Inputs, Outputs


class Reverse(Model):
    """Returns the raw body reversed (a new buffer, unlike echo)."""

    def infer(self, batch: Sequence[Inputs]) -> Sequence[Outputs]:
        return [{"raw": inputs["raw"][::-1].copy()} for inputs in batch]


class FailsToLoad(Model):
    def load(self) -> None:
        raise FileNotFoundError("weights missing: /nonexistent/model.bin")

    def infer(self, batch: Sequence[Inputs]) -> Sequence[Outputs]:
        return list(batch)
