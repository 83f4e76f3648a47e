"""The built-in ``echo`` model: the diagnostic and benchmark model (like Triton's identity).

* ``infer`` returns each input's own memory: output *i* is input *i*, any shape and dtype.
* ``generate`` streams the prompt's whitespace-separated tokens back, cycling until
  ``max_tokens``, or once through when no limit is given. With ``req.raw`` (the raw
  endpoint) the pieces are the body's tokens as bytes; otherwise text pieces,
  each token after the first preceded by one space, so the pieces join to the prompt.
  Raw pieces are ``bytes`` (a copy of each token: for tokens of a few bytes that is
  cheaper than slicing views of the body).
* ``embed`` gives deterministic unit vectors derived from a hash of each text.
"""

from __future__ import annotations

import hashlib
import itertools
from collections.abc import Iterator, Sequence
from typing import Any, ClassVar

import numpy as np

from .base import GenerateRequest, Inputs, Model, Outputs, Piece, TensorSpec

EMBED_DIM = 64


_IS_SPACE = np.zeros(256, dtype=bool)
_IS_SPACE[list(b" \t\n\r\x0b\x0c\x1c\x1d\x1e\x1f")] = True  # what str.split() splits at (ASCII)


def _split(text: Any, limit: int | None) -> list[Any]:
    """Whitespace-separated tokens; only the first ``limit`` when fewer are needed (a 64 KB
    prompt asked for 16 tokens must not be split into thousands)."""
    if limit is None:
        return list(text.split())
    tokens: list[Any] = text.split(None, limit)
    return tokens[:limit] if len(tokens) > limit else tokens


def _cycle(pieces: list[Any], limit: int | None) -> Iterator[Any]:
    """The pieces once (no limit), or cycled until ``limit`` pieces were produced."""
    if limit is None or not pieces:
        return iter(pieces)
    return itertools.islice(itertools.cycle(pieces), limit)


class EchoModel(Model):
    executor = "inline"
    description: ClassVar[str] = "Identity / echo model for diagnostics and benchmarks."

    def infer(self, batch: Sequence[Inputs]) -> Sequence[Outputs]:
        return [dict(inputs) for inputs in batch]

    def generate(self, req: GenerateRequest) -> Iterator[Piece]:
        limit = req.max_tokens
        if req.raw is not None:
            # Tokens are a few bytes: bytes.split() copies them in ~11 us per 256, while
            # 256 memoryview slices cost ~50 us plus ~50 us to find their spans.
            return _cycle(_split(bytes(req.raw), limit), limit)
        tokens = _split(req.prompt, limit)
        pieces = [tok if i == 0 else " " + tok for i, tok in enumerate(tokens)]
        if limit is not None and limit > len(tokens) and tokens:
            # After the first pass every token is preceded by a space, the first too.
            cycle = [" " + tok for tok in tokens]
            return itertools.chain(pieces, _cycle(cycle, limit - len(pieces)))
        return _cycle(pieces, limit)

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        out = np.empty((len(texts), EMBED_DIM), dtype=np.float32)
        for i, text in enumerate(texts):
            seed = int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "little")
            vec = np.random.default_rng(seed).standard_normal(EMBED_DIM).astype(np.float32)
            out[i] = vec / np.linalg.norm(vec)
        return out

    def count_tokens(self, text: str) -> int:
        if text.isascii():
            # Counting word starts in numpy avoids building a str per word (a 64 KB
            # prompt has ~9,000): ~20 us instead of ~250 us.
            space = _IS_SPACE[np.frombuffer(text.encode("ascii"), dtype=np.uint8)]
            if not len(space):
                return 0
            return int(np.count_nonzero(space[:-1] & ~space[1:])) + int(not space[0])
        return len(text.split())

    # V2 metadata. Echo is an identity over any inputs: each output has its input's name,
    # data type and shape, so one variable tensor stands for all of them (-1: any length).
    def inputs(self) -> list[TensorSpec]:
        return [TensorSpec("INPUT0", "BYTES", (-1,))]

    def outputs(self) -> list[TensorSpec]:
        return [TensorSpec("INPUT0", "BYTES", (-1,))]
