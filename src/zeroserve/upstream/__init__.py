"""Connections to upstream HTTP servers: the gateway's socket I/O, below ``app/``.

``pool`` holds each upstream's keep-alive connections, its passive health and its
statistics; ``exchange`` is one request/response on a connection with its bounded body
queue. The bytes on the wire are ``http.client``'s (the client role of ``http/``). This
package opens sockets so that ``app/`` does not (docs/architecture.md, "upstream/").
"""

from ..errors import UpstreamUnreachable
from .exchange import Exchange
from .pool import POOL_IDLE_S, Upstream, UpstreamConnection, UpstreamStatistics

__all__ = [
    "POOL_IDLE_S",
    "Exchange",
    "Upstream",
    "UpstreamConnection",
    "UpstreamStatistics",
    "UpstreamUnreachable",
]
