"""``TinyLlamaModel``: the embedded demo generative model, run with numpy alone.

Strategy: ``load`` reads fp16 safetensors once into float32 arrays shared read-only by
all requests; ``generate`` prefills the prompt in one forward pass, then decodes one
token per step with a KV cache owned by that call, so concurrent generations never share
mutable state. Text leaves through ``TextStream`` (UTF-8 safe, stop strings honoured).
"""

from __future__ import annotations

import json
from collections.abc import Generator, Mapping, Sequence
from pathlib import Path
from typing import Any, ClassVar, Literal

import numpy as np

from ..base import GENERATE_EXTENSIONS, ExecutorKind, GenerateRequest, Model
from ._forward import KVCache, Weights, forward
from ._sample import Sampler
from ._text import TextStream, token_bytes

FinishReason = Literal["stop", "length"]

#: The folder holding the shipped artefacts (written by ``make model``).
MODEL_DIR = Path(__file__).resolve().parent
#: Tokens of context: the trained sequence length (config ``max_position_embeddings``).
CONTEXT_LENGTH = 512


class TinyLlamaModel(Model):
    """A 0.9 M-parameter Llama-style demo model trained on CPython's documentation.

    It writes fluent-looking but meaningless Python-documentation prose: it exists so a
    fresh install can serve real token-by-token generation with no download. See
    ``NOTICE.txt`` beside this file and ``tools/train_tinyllm.py``.

    ``generate(req)`` is a synchronous generator of ``str`` pieces. Each piece holds only
    complete characters (a character whose UTF-8 bytes span several tokens comes out
    whole), and a stop string is never emitted, even across piece boundaries. **The finish
    reason is the generator's return value** (``StopIteration.value``, or the value of
    ``yield from``): ``"stop"`` when the model ended its answer (end-of-text or another
    special token) or a stop string matched, ``"length"`` when ``max_tokens`` tokens were
    generated or the context (512 tokens) is full. It lives in the generator, not on the
    model, so concurrent requests cannot mix it up::

        gen = model.generate(req)
        try:
            while True:
                piece = next(gen)
        except StopIteration as done:
            finish_reason = done.value

    Sampling (``_sample.py``): ``temperature`` 0 is greedy (deterministic); otherwise
    softmax at that temperature, restricted to the smallest set of tokens whose
    probability reaches ``top_p``, drawn from ``numpy.random.default_rng(seed)``
    (deterministic for a given seed). It honours vLLM's ``top_k``, ``min_p``,
    ``repetition_penalty``, ``ignore_eos`` (no end token: the answer runs to
    ``max_tokens`` or the full context) and ``min_tokens`` (no end token before that
    many; stop strings still end it). ``max_tokens`` counts generated tokens; ``None`` means until the context is
    full. The prompt is preceded by one ``<|endoftext|>`` token (a document boundary, as
    in training); a prompt longer than the context keeps its last tokens.

    Chat template (``chat_template``): each message becomes ``<|role|>\\n{content}\\n``
    for ``system`` and ``user`` (other roles are rendered as ``user``), and an earlier
    ``assistant`` message ``<|assistant|>\\n{content}<|endoftext|>``; the prompt ends with
    ``<|assistant|>\\n``. The role markers are single special tokens. The model was trained
    on documents of the form ``<|user|>\\n{name}\\n<|assistant|>\\n{text}<|endoftext|>``
    (``name`` a stdlib object or a pydoc topic), so a user message such as ``str.split``
    or ``for`` draws the most plausible prose.

    Options (keyword arguments):
        path: a folder with ``config.json``, ``tokenizer.json`` and
            ``weights.safetensors`` (default: the shipped model).

    Thread safety: weights and tokenizer are read-only after ``load``; each call to
    ``generate`` has its own KV cache and random generator.
    """

    # Process, so that a busy tinyllm never holds the event loop's GIL: on threads a
    # decode step (~0.6 ms CPU, ~100 small numpy calls, only the matmuls without the GIL)
    # kept /health p99 at 9 ms while 32 streams ran. A worker process decodes with its own
    # GIL and streams pieces through the arena's channel (credits bound what it runs
    # ahead). Measured by benchmarks/scripts/bench_tinyllm.py: threads added little
    # parallelism anyway (4 streams: process CPU/wall ~1.1).
    executor: ClassVar[ExecutorKind] = "process"
    description: ClassVar[str] = (
        "demo model: 0.9M-parameter Llama-style model trained by zeroserve on CPython's "
        "docs; writes fluent-looking, meaningless Python-doc prose"
    )
    context_length: ClassVar[int | None] = CONTEXT_LENGTH
    honours: ClassVar[frozenset[str]] = GENERATE_EXTENSIONS

    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        self.path = Path(options.get("path") or MODEL_DIR)
        self._weights: Weights | None = None
        self._tokenizer: Any = None
        self._token_bytes: list[bytes] = []
        self._end_ids: frozenset[int] = frozenset()
        self.eos_id = -1
        self.config: dict[str, Any] = {}

    # -- lifecycle ---------------------------------------------------------------------
    def load(self) -> None:
        from safetensors.numpy import load_file
        from tokenizers import Tokenizer

        config = json.loads((self.path / "config.json").read_text())
        if int(config["max_position_embeddings"]) != CONTEXT_LENGTH:
            raise ValueError(
                f"{self.path}: context {config['max_position_embeddings']} != {CONTEXT_LENGTH}"
            )
        tensors = load_file(str(self.path / "weights.safetensors"))
        self._weights = Weights.from_tensors(tensors, config)
        tok = Tokenizer.from_file(str(self.path / "tokenizer.json"))
        tok.no_padding()
        tok.no_truncation()
        special = list(config["special_tokens"])
        self._token_bytes = token_bytes(tok.get_vocab(with_added_tokens=True), special)
        # Any special token ends the answer: end-of-text, or the model opening a new turn.
        end_ids = [tok.token_to_id(s) for s in special]
        if any(i is None for i in end_ids):
            raise ValueError(f"{self.path}: tokenizer lacks a special token of {special}")
        self._end_ids = frozenset(int(i) for i in end_ids if i is not None)
        self.eos_id = int(config["eos_token_id"])
        self._tokenizer = tok
        self.config = config

    # -- capabilities ------------------------------------------------------------------
    def generate(self, req: GenerateRequest) -> Generator[str, None, FinishReason]:
        w = self._loaded()
        limit = CONTEXT_LENGTH if req.max_tokens is None else max(0, int(req.max_tokens))
        if limit == 0:
            return "length"
        ids = [self.eos_id, *self._encode(req.prompt)]
        if len(ids) > CONTEXT_LENGTH - 1:  # keep the end of the prompt, room for 1 token
            ids = ids[len(ids) - (CONTEXT_LENGTH - 1) :]
        cache = KVCache(w, min(CONTEXT_LENGTH, len(ids) + limit))
        logits = forward(w, np.asarray(ids, dtype=np.intp), cache)
        stream = TextStream(req.stop)
        sampler = Sampler(req, w.embed.shape[0], self._end_ids, ids)
        produced = 0
        while True:
            tok = sampler.next(logits, produced)
            produced += 1
            if tok in self._end_ids:
                tail = stream.flush()
                if tail:
                    yield tail
                return "stop"
            piece = stream.push(self._token_bytes[tok])
            if piece:
                yield piece
            if stream.stopped:
                return "stop"
            if produced >= limit or cache.length >= cache.capacity:
                tail = stream.flush()
                if tail:
                    yield tail
                return "length"
            logits = forward(w, np.array([tok], dtype=np.intp), cache)

    def count_tokens(self, text: str) -> int:
        """Tokens of ``text`` as the model reads it (special tokens count as one each)."""
        return len(self._encode(text))

    def tokenize(self, text: str, add_special_tokens: bool) -> list[int]:
        """Tokens of ``text``; with ``add_special_tokens``, the ``<|endoftext|>`` that
        ``generate`` puts before every prompt (a document boundary) first."""
        ids = self._encode(text)
        return [self._eos(), *ids] if add_special_tokens else ids

    def detokenize(self, tokens: Sequence[int]) -> str:
        self._encode("")  # the tokenizer, loaded once
        size = int(self._tokenizer.get_vocab_size(with_added_tokens=True))
        bad = next((t for t in tokens if not 0 <= t < size), None)
        if bad is not None:
            raise ValueError(f"token {bad} is outside the vocabulary (0..{size - 1})")
        text: str = self._tokenizer.decode(list(tokens), skip_special_tokens=False)
        return text

    def _eos(self) -> int:
        if self.eos_id < 0:  # the metadata instance of a process model: read once
            config = json.loads((self.path / "config.json").read_text())
            self.eos_id = int(config["eos_token_id"])
        return self.eos_id

    def chat_template(self, messages: Sequence[Mapping[str, str]]) -> str:
        """Render chat messages to a prompt; the format is in the class docstring."""
        parts: list[str] = []
        for m in messages:
            role = m.get("role", "user")
            content = m.get("content") or ""
            if role == "assistant":
                parts.append(f"<|assistant|>\n{content}<|endoftext|>")
            else:
                parts.append(f"<|{'system' if role == 'system' else 'user'}|>\n{content}\n")
        parts.append("<|assistant|>\n")
        return "".join(parts)

    # -- helpers -----------------------------------------------------------------------
    def _loaded(self) -> Weights:
        if self._weights is None:
            raise RuntimeError("TinyLlamaModel.load() was not called")
        return self._weights

    def _encode(self, text: str) -> list[int]:
        if self._tokenizer is None:
            # The metadata instance of a process model is never loaded; counting tokens
            # (usage, context checks) needs only the tokenizer, which loads in a few ms.
            from tokenizers import Tokenizer

            tok = Tokenizer.from_file(str(self.path / "tokenizer.json"))
            tok.no_padding()
            tok.no_truncation()
            self._tokenizer = tok
        ids: list[int] = self._tokenizer.encode(text, add_special_tokens=False).ids
        return ids
