"""The remote-inference gateway: relays requests for ``remote:`` models to their
OpenAI-compatible upstreams without decoding the streams (docs/gateway.md).

The ``remote`` backend (``app/backends/remote.py``) holds one :class:`Relay` per remote
model and calls ``relay.forward(req, path)`` for every API: the model is found from the
body's ``"model"`` before anything decodes the body, so parameters only the upstream
understands pass through untouched. The sockets to the upstreams are ``upstream/``'s and
their bytes ``http.client``'s; this package decides where a request goes and what it
carries (docs/gateway.md, "Layering").
"""

from __future__ import annotations

from ...errors import UpstreamUnavailable, UpstreamUnreachable
from ...upstream import UpstreamStatistics
from ._relay import Relay, RelayStatistics, api_key

__all__ = [
    "Relay",
    "RelayStatistics",
    "UpstreamStatistics",
    "UpstreamUnavailable",
    "UpstreamUnreachable",
    "api_key",
]
