"""What serves each model's APIs (docs/architecture.md, "One chat path", "Adding a
backend"): the protocols (``base.py``), the table of every model's backend
(``table.py``), and the backends (``local.py``, ``llamacpp/``, ``remote.py``)."""

from .base import Backend, BackendStatistics, FrontEnd
from .remote import RAW
from .table import FACTORIES, Backends

__all__ = [
    "FACTORIES",
    "RAW",
    "Backend",
    "BackendStatistics",
    "Backends",
    "FrontEnd",
]
