"""Who may load and unload models: an admin (docs/architecture.md, "Models at run time").

With API keys configured, the edge has already refused a request without a known key
(401); here a key not marked ``admin = true`` in the keys file is refused with 403. With
no keys, only a peer on this host (a loopback address) may call these routes, so a
server listening on ``0.0.0.0`` without keys cannot be driven from the network.
"""

from __future__ import annotations

from ...errors import Forbidden
from ..request import Request

NOT_ADMIN = (
    "loading and unloading models needs an admin API key (admin = true in the API keys file)"
)
NOT_LOCAL = (
    "loading and unloading models is allowed only from this host when no API keys are "
    "configured (configure an admin key to allow it from elsewhere)"
)


def require_admin(req: Request, keyed: bool) -> None:
    """Raise ``Forbidden`` (403) unless ``req`` may control models; ``keyed``: whether
    the server has API keys."""
    if keyed:
        key = req.edge.key if req.edge is not None else None
        if key is None or not key.admin:
            raise Forbidden(NOT_ADMIN)
    elif not req.loopback:
        raise Forbidden(NOT_LOCAL)
