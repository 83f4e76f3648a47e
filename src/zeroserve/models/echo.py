"""The built-in ``echo`` model: the diagnostic and benchmark model (like Triton's identity).

* ``infer`` returns each input's own memory: output *i* is input *i*, any shape and dtype.
* ``generate`` streams the prompt's whitespace-separated tokens back, cycling until
  ``max_tokens``, or once through when no limit is given. With ``req.raw`` (the raw
  endpoint) the pieces are zero-copy views of the request body; otherwise text pieces,
  each token after the first preceded by one space, so the pieces join to the prompt.
* ``embed`` gives deterministic unit vectors derived from a hash of each text.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterator, Sequence
from typing import ClassVar

import numpy as np

from .base import GenerateRequest, Inputs, Model, Outputs, Piece, TensorSpec

EMBED_DIM = 64
_WS = re.compile(rb"\S+")


class EchoModel(Model):
    executor = "inline"
    description: ClassVar[str] = "Identity / echo model for diagnostics and benchmarks."

    def infer(self, batch: Sequence[Inputs]) -> Sequence[Outputs]:
        return [dict(inputs) for inputs in batch]

    def generate(self, req: GenerateRequest) -> Iterator[Piece]:
        limit = req.max_tokens
        if req.raw is not None:
            raw = memoryview(req.raw).cast("B")
            spans = [m.span() for m in _WS.finditer(raw)]
            if not spans:
                return
            produced = 0
            while limit is None or produced < limit:
                for start, end in spans:
                    if limit is not None and produced >= limit:
                        return
                    yield raw[start:end]
                    produced += 1
                if limit is None:
                    return
            return
        tokens = req.prompt.split()
        if not tokens:
            return
        produced = 0
        while limit is None or produced < limit:
            for tok in tokens:
                if limit is not None and produced >= limit:
                    return
                yield tok if produced == 0 else " " + tok
                produced += 1
            if limit is None:
                return

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        out = np.empty((len(texts), EMBED_DIM), dtype=np.float32)
        for i, text in enumerate(texts):
            seed = int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "little")
            vec = np.random.default_rng(seed).standard_normal(EMBED_DIM).astype(np.float32)
            out[i] = vec / np.linalg.norm(vec)
        return out

    def count_tokens(self, text: str) -> int:
        return len(text.split())

    # V2 metadata. Echo is an identity over any inputs: each output has its input's name,
    # data type and shape, so one variable tensor stands for all of them (-1: any length).
    def inputs(self) -> list[TensorSpec]:
        return [TensorSpec("INPUT0", "BYTES", (-1,))]

    def outputs(self) -> list[TensorSpec]:
        return [TensorSpec("INPUT0", "BYTES", (-1,))]
