"""The production edge, run at a request's head before admission: API keys, per-key
quotas, CORS, request ids and the access log (docs/architecture.md, "The edge").

Sans-I/O: everything is decided from a head's method, path, query and headers on an
injected clock; the server calls ``Edge.start``, ``Edge.admit`` and ``Edge.finish``.
"""

from __future__ import annotations

from .access_log import AccessLog, AccessRecord
from .cors import CorsPolicy
from .gate import Edge, EdgeContext, EdgeEnd
from .keys import ApiKey, KeyLimits, KeyRing, load_keys_file
from .options import EdgeOptions
from .quotas import KeyQuota, TokenBucket
from .request_id import RequestIds

__all__ = [
    "AccessLog",
    "AccessRecord",
    "ApiKey",
    "CorsPolicy",
    "Edge",
    "EdgeContext",
    "EdgeEnd",
    "EdgeOptions",
    "KeyLimits",
    "KeyQuota",
    "KeyRing",
    "RequestIds",
    "TokenBucket",
    "load_keys_file",
]
