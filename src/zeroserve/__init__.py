"""zeroserve: a zero-copy Python AI-inference server."""

from .errors import ZeroserveError
from .models.base import GenerateRequest, Model, TensorSpec

__version__ = "0.1.0"

__all__ = ["GenerateRequest", "Model", "TensorSpec", "ZeroserveError", "__version__"]
