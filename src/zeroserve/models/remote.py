"""The ``remote`` backend: an OpenAI-compatible upstream (or several) that zeroserve relays.

``--model NAME=remote:URL[,URL...][?option=value&...]``, e.g.
``gpt=remote:http://10.0.0.5:8000/v1,http://10.0.0.6:8000/v1?upstream_model=llama-3&connections=32``.

This class holds configuration only. It has no ``infer``/``generate``/``embed``, so the
engine hosts it with no capabilities (it gets admission, a name in ``engine.names()`` and
``/v1/models``, and nothing else); the app layer recognises it (``app.relay.relay_for``)
and relays requests to the upstreams without decoding them. See docs/gateway.md.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, ClassVar
from urllib.parse import urlsplit

from .base import Model

# Keep-alive connections per upstream. vLLM and llama.cpp serve many concurrent requests
# per process; 64 covers a busy upstream without opening a socket per request.
DEFAULT_CONNECTIONS = 64
# Seconds to establish a TCP (and TLS) connection. A LAN peer answers in under a ms;
# a hosted API in ~100 ms. Past 5 s the peer is down or unreachable: try another.
DEFAULT_CONNECT_TIMEOUT_S = 5.0
# Seconds from the request written to the response head. Upstreams send headers of a
# stream at once and of a non-streamed completion after generating it: a minute bounds a
# long completion on a loaded upstream.
DEFAULT_FIRST_BYTE_TIMEOUT_S = 60.0
# Seconds for the whole exchange (first byte and the whole stream): the runtime's
# default request deadline (runtime.engine.DEFAULT_DEADLINE_S), five minutes.
DEFAULT_TIMEOUT_S = 300.0
# Consecutive failures that eject an upstream, and how long it stays out. Three in a row
# is past bad luck; 10 s is long enough to stop hammering a restarting server and short
# enough to take it back soon (nginx's max_fails=1/fail_timeout=10 s, Envoy's 5 x 30 s).
DEFAULT_MAX_FAILS = 3
DEFAULT_EJECT_S = 10.0
# Attempts on another upstream after a refused connection or a 5xx head (once: docs/gateway.md, "Balancing, fail-over, health").
DEFAULT_RETRIES = 1
# Bytes of upstream response held for a slow client before reading the upstream pauses
# (a bounded queue: 256 KiB is one transport write buffer, see server.options).
DEFAULT_QUEUE_BYTES = 256 * 1024

_SCHEMES = {"http": 80, "https": 443}


@dataclass(frozen=True, slots=True)
class UpstreamURL:
    """One upstream base URL, e.g. ``http://host:8000/v1`` (paths are appended to it)."""

    url: str
    scheme: str
    host: str
    port: int
    base_path: str  # without a trailing slash

    @property
    def tls(self) -> bool:
        return self.scheme == "https"

    @property
    def authority(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return host if self.port == _SCHEMES[self.scheme] else f"{host}:{self.port}"


def parse_upstream(url: str) -> UpstreamURL:
    """Parse and check one upstream base URL. Raises ``ValueError`` saying what is wrong."""
    parts = urlsplit(url.strip())
    if parts.scheme not in _SCHEMES:
        raise ValueError(f"upstream {url!r}: the scheme must be http or https")
    if not parts.hostname:
        raise ValueError(f"upstream {url!r} has no host")
    if parts.query or parts.fragment:
        raise ValueError(f"upstream {url!r}: a base URL takes no query or fragment")
    try:
        port = parts.port or _SCHEMES[parts.scheme]
    except ValueError as exc:
        raise ValueError(f"upstream {url!r}: {exc}") from None
    return UpstreamURL(
        url=url.strip().rstrip("/"),
        scheme=parts.scheme,
        host=parts.hostname,
        port=port,
        base_path=parts.path.rstrip("/"),
    )


@dataclass(frozen=True, slots=True)
class RemoteOptions:
    """Everything the relay needs to know about one remote model."""

    upstreams: tuple[UpstreamURL, ...]
    upstream_model: str | None = None  # rewrite the body's "model" to this
    api_key_env: str | None = None  # environment variable holding the API key
    connections: int = DEFAULT_CONNECTIONS
    connect_timeout: float = DEFAULT_CONNECT_TIMEOUT_S
    first_byte_timeout: float = DEFAULT_FIRST_BYTE_TIMEOUT_S
    timeout: float = DEFAULT_TIMEOUT_S
    max_fails: int = DEFAULT_MAX_FAILS
    eject_s: float = DEFAULT_EJECT_S
    retries: int = DEFAULT_RETRIES
    queue_bytes: int = DEFAULT_QUEUE_BYTES
    # Pass the client's own credential headers (authorization, api-key, x-api-key) on to
    # the upstream. Off: the gateway's API key is for the gateway, and the upstream gets
    # the gateway's own key (``api_key_env``) or none.
    forward_client_key: bool = False


class RemoteModel(Model):
    """A model served by OpenAI-compatible upstreams; zeroserve relays its requests.

    Options (all optional but ``location``): ``upstream_model``, ``api_key_env``,
    ``forward_client_key`` (pass the client's key on instead), ``connections``, ``connect_timeout``, ``first_byte_timeout``, ``timeout`` (seconds,
    the whole exchange), ``max_fails``, ``eject_s``, ``retries``, ``queue_bytes``.
    """

    executor = "inline"
    served_by = "remote"
    description: ClassVar[str] = "OpenAI-compatible upstream, relayed without decoding."

    def __init__(self, location: str = "", **options: Any) -> None:
        super().__init__(location=location, **options)
        urls = [u for u in str(location).split(",") if u.strip()]
        if not urls:
            raise ValueError("a remote model needs at least one upstream URL")
        known = set(RemoteOptions.__dataclass_fields__) - {"upstreams"}
        unknown = sorted(set(options) - known)
        if unknown:
            raise ValueError(
                f"unknown remote option(s) {', '.join(unknown)}; known: {', '.join(sorted(known))}"
            )
        kw: dict[str, Any] = {}
        for key in ("upstream_model", "api_key_env"):
            if options.get(key) not in (None, ""):
                kw[key] = str(options[key])
        for key in ("connections", "max_fails", "retries", "queue_bytes"):
            if key in options:
                kw[key] = _positive(key, options[key], int, allow_zero=key == "retries")
        for key in ("connect_timeout", "first_byte_timeout", "timeout", "eject_s"):
            if key in options:
                kw[key] = _positive(key, options[key], float)
        if "forward_client_key" in options:
            kw["forward_client_key"] = _flag("forward_client_key", options["forward_client_key"])
        self.config = RemoteOptions(upstreams=tuple(parse_upstream(u) for u in urls), **kw)
        self.api_key: str | None = None

    def load(self) -> None:
        env = self.config.api_key_env
        if env is not None:
            key = os.environ.get(env)
            if not key:
                raise ValueError(f"api_key_env: environment variable {env} is not set")
            self.api_key = key


def _flag(key: str, value: Any) -> bool:
    if isinstance(value, bool):
        return value
    text = str(value).lower()
    if text in ("1", "true", "yes", "on"):
        return True
    if text in ("0", "false", "no", "off"):
        return False
    raise ValueError(f"remote option {key}={value!r} must be true or false")


def _positive(key: str, value: Any, conv: type, *, allow_zero: bool = False) -> Any:
    try:
        v = conv(value)
    except (TypeError, ValueError):
        raise ValueError(f"remote option {key}={value!r} must be a number") from None
    if v < 0 or (v == 0 and not allow_zero):
        raise ValueError(f"remote option {key}={value!r} must be positive")
    return v
