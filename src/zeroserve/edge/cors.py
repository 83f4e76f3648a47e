"""CORS: which browser origins may call the API, answered from the request head.

Strategy
--------
Off by default: no origin is configured, nothing is added. With ``origins=("*",)`` every
origin gets ``access-control-allow-origin: *``; with a list, a request's ``Origin`` is
reflected only when it is listed exactly (scheme, host and port), with ``vary: origin`` so
caches keep the answers apart. A wildcard is never combined with credentials (browsers
reject it, and reflecting any origin with credentials would let every site act as the
user): the configuration refuses it.

A preflight (``OPTIONS`` with ``Origin`` and ``Access-Control-Request-Method``) is answered
at the head by the caller, 204 No Content, with the headers ``preflight()`` returns; a
disallowed origin gets none of the allow headers.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence

Headers = list[tuple[bytes, bytes]]

# Seconds a browser may cache a preflight answer (Chrome caps it at 7200, Firefox at 86400);
# ten minutes keeps a configuration change visible soon.
PREFLIGHT_MAX_AGE_S = 600
ALLOW_METHODS = b"GET, POST, OPTIONS"
# Headers a browser client of the OpenAI, KServe and raw APIs sends.
ALLOW_HEADERS = (
    b"authorization, content-type, api-key, x-api-key, x-request-id, traceparent, tracestate, "
    b"inference-header-content-length, openai-organization, openai-project, "
    b"x-stainless-arch, x-stainless-lang, x-stainless-os, x-stainless-package-version, "
    b"x-stainless-retry-count, x-stainless-runtime, x-stainless-runtime-version, "
    b"x-stainless-timeout, x-priority"
)
EXPOSE_HEADERS = (
    b"x-request-id, retry-after, retry-after-ms, inference-header-content-length, "
    b"x-ratelimit-limit-requests, x-ratelimit-remaining-requests, x-ratelimit-reset-requests, "
    b"x-ratelimit-limit-tokens, x-ratelimit-remaining-tokens, x-ratelimit-reset-tokens"
)
_ORIGIN = re.compile(r"(https?)://[A-Za-z0-9.\-\[\]:]+\Z")


class CorsPolicy:
    """The configured origins. ``simple()`` gives the headers of an actual response,
    ``preflight()`` those of a preflight answer; both are empty for other origins."""

    __slots__ = ("_any", "_origins", "credentials")

    def __init__(self, origins: Sequence[str], *, allow_credentials: bool = False) -> None:
        self._any = "*" in origins
        if self._any and len(origins) > 1:
            raise ValueError("cors_origins: '*' cannot be combined with listed origins")
        if self._any and allow_credentials:
            raise ValueError(
                "cors_allow_credentials cannot be used with cors_origins '*': list the origins"
            )
        for origin in origins:
            if origin != "*" and not _ORIGIN.match(origin):
                raise ValueError(
                    f"cors_origins: {origin!r} is not an origin like https://app.example.com"
                )
        self._origins = frozenset(o.rstrip("/").lower().encode("ascii") for o in origins)
        self.credentials = allow_credentials

    def _allow(self, origin: bytes) -> Headers:
        if self._any:
            return [(b"access-control-allow-origin", b"*")]
        if origin.lower() not in self._origins:
            return []
        out = [(b"access-control-allow-origin", origin), (b"vary", b"origin")]
        if self.credentials:
            out.append((b"access-control-allow-credentials", b"true"))
        return out

    def simple(self, origin: bytes) -> Headers:
        allow = self._allow(origin)
        if allow:
            allow.append((b"access-control-expose-headers", EXPOSE_HEADERS))
        return allow

    def preflight(self, origin: bytes) -> Headers:
        allow = self._allow(origin)
        if not allow:
            return [(b"vary", b"origin")] if not self._any else []
        allow += [
            (b"access-control-allow-methods", ALLOW_METHODS),
            (b"access-control-allow-headers", ALLOW_HEADERS),
            (b"access-control-max-age", b"%d" % PREFLIGHT_MAX_AGE_S),
        ]
        return allow


def is_preflight(method: str, headers: Iterable[tuple[bytes, bytes]]) -> bool:
    if method != "OPTIONS":
        return False
    return any(name == b"access-control-request-method" for name, _ in headers)
