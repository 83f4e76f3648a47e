"""Models: the user-facing Model API, built-in models and backends."""

from .base import GenerateRequest, Model, TensorSpec
from .echo import EchoModel

__all__ = ["EchoModel", "GenerateRequest", "Model", "TensorSpec"]
