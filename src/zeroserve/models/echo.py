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
    embedding_dimensions: ClassVar[int | None] = EMBED_DIM

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
        """``len(text.split())``, without building a str per word (a 64 KB prompt has
        ~9,000): for ASCII, the word starts are counted in numpy over the bytes, ~20 us
        against ~250 us for the split (and ~140 us for a 256-entry table lookup)."""
        if not text.isascii():
            return len(text.split())
        a = np.frombuffer(text.encode("ascii"), dtype=np.uint8)
        if not len(a):
            return 0
        # What str.split() splits at, in ASCII: space, 9-13 (\t \n \v \f \r) and 28-31,
        # all <= 32. The other bytes <= 32 (0-8, 14-27) do not split; they are masked out
        # only when the text has a byte below 32 at all (a newline is one).
        space = a <= 32
        if np.count_nonzero(a < 32):
            space &= ~((a < 9) | ((a > 13) & (a < 28)))
        # A word starts at a non-space after a space, or at the first byte.
        return int(np.count_nonzero(space[:-1] > space[1:])) + int(not space[0])

    # V2 metadata. Echo is an identity over any inputs: each output has its input's name,
    # data type and shape, so one variable tensor stands for all of them (-1: any length).
    def inputs(self) -> list[TensorSpec]:
        return [TensorSpec("INPUT0", "BYTES", (-1,))]

    def outputs(self) -> list[TensorSpec]:
        return [TensorSpec("INPUT0", "BYTES", (-1,))]
