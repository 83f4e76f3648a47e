"""The embedded default embedding model: all-MiniLM-L6-v2 on onnxruntime (no torch)."""

from ...errors import ModelFileError
from .model import (
    EMBED_DIM,
    ONNX_DISTRIBUTION,
    ONNX_SHA256,
    ONNX_VERSION,
    MiniLMEmbedder,
    mean_pool_normalize,
    onnx_path,
)

__all__ = [
    "EMBED_DIM",
    "ONNX_DISTRIBUTION",
    "ONNX_SHA256",
    "ONNX_VERSION",
    "MiniLMEmbedder",
    "ModelFileError",
    "mean_pool_normalize",
    "onnx_path",
]
