"""The edge's options: a small value object built by ``config.py``."""

from __future__ import annotations

from dataclasses import dataclass

from .keys import ApiKey

# Paths that stay open when keys are configured: load balancers and Kubernetes probe
# them without credentials. ``/metrics`` joins them unless ``auth_metrics`` is set.
OPEN_PATHS = frozenset({"/health", "/ready", "/v2/health/live", "/v2/health/ready"})
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
