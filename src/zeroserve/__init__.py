"""zeroserve: a zero-copy Python AI-inference server."""

from . import buildinfo

buildinfo.guard()  # before any compiled module is imported (docs/decisions/0007-compiled-build.md)

from .errors import ZeroserveError  # noqa: E402
from .models.base import GenerateRequest, Model, TensorSpec  # noqa: E402

__version__ = "0.1.0"

__all__ = ["GenerateRequest", "Model", "TensorSpec", "ZeroserveError", "__version__"]
