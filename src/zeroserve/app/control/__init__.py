"""Model control: loading and unloading catalog models over HTTP, and on demand
(docs/architecture.md, "Models at run time").

* ``routes.py``: llama.cpp router's ``GET /models``, ``POST /models/load`` and
  ``POST /models/unload``; the KServe V2 repository extension (``/v2/repository/...``).
* ``access.py``: who may call them (admin keys, or a loopback peer without keys).
* ``loading.py``: ``ManagerAutoload``, a request's load on demand, and a model's status
  in llama.cpp's shape (``/v1/models`` and ``/models`` share it).
"""

from .loading import ManagerAutoload, load_status
from .routes import register

__all__ = ["ManagerAutoload", "load_status", "register"]
