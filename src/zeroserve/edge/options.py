"""The edge's options: a small value object built by ``config.py``."""

from __future__ import annotations

from dataclasses import dataclass

from .keys import ApiKey

# The page at / and its two files (docs/architecture.md, "The page at /"): no data in
# them, which a browser fetches without credentials; the page then asks for a key and
# sends it with every API call it makes (/v1/stats included).
PAGE_PATHS = frozenset({"/", "/ui/app.js", "/ui/app.css"})
# Paths that stay open when keys are configured: load balancers and Kubernetes probe
# them without credentials. ``/metrics`` joins them unless ``auth_metrics`` is set.
OPEN_PATHS = frozenset({"/health", "/ready", "/v2/health/live", "/v2/health/ready"}) | PAGE_PATHS
METRICS_PATH = "/metrics"


@dataclass(frozen=True, slots=True)
class EdgeOptions:
    """``keys`` empty: no authentication. ``cors_origins`` empty: no CORS headers.
    ``access_log`` ``None``: no access log (``"-"`` is stderr)."""

    keys: tuple[ApiKey, ...] = ()
    auth_metrics: bool = False
    cors_origins: tuple[str, ...] = ()
    cors_allow_credentials: bool = False
    access_log: str | None = None
    request_ids: bool = True
    tracing: bool = False

    @property
    def active(self) -> bool:
        """Whether anything beyond request ids runs at the head."""
        return bool(self.keys or self.cors_origins or self.access_log or self.tracing)
