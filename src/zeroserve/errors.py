"""The zeroserve exception tree. Every error carries the HTTP answer it maps to.

    ZeroserveError                 status 500 unless a subclass says otherwise
    ├── ProtocolError              malformed HTTP; ``status`` is 400/408/413/414/417/431/501/505
    ├── RequestError               400: the request is well-framed but its content is invalid
    │   └── CapabilityError        400: the model lacks the capability the endpoint needs
    ├── NotFound                   404: unknown route, model, version or output
    │   └── ModelNotFound
    ├── Unauthorized               401: no API key, or not one we know (``WWW-Authenticate``)
    ├── Forbidden                  403: a known caller that may not do this (an admin route)
    ├── MethodNotAllowed           405, with the allowed methods
    ├── Conflict                   409: the resource's state forbids it (a pinned model's unload)
    ├── PayloadTooLarge            413
    ├── Overloaded                 429 (per model) or 503 (server), with ``retry_after`` seconds
    │   └── RateLimited            429: an API key's own quota, with OpenAI's rate-limit headers
    ├── DeadlineExceeded           504
    ├── WorkerError                500/503: a model worker crashed or failed mid-request
    ├── UpstreamError              502: a remote upstream failed
    │   └── UpstreamUnreachable    nothing was answered; the request may go elsewhere
    ├── UpstreamUnavailable        503: every upstream of a remote model is ejected
    ├── ClusterUnavailable         503: the Ray cluster a model runs on is unreachable
    ├── ConfigError                the configuration (file, environment, flags) is invalid
    ├── SpecError                  a model spec (``name=module:Class``) is invalid
    ├── ModelFileError             a model's file is missing or not the pinned one
    │   └── GGUFError              a GGUF file that cannot be served (missing, not GGUF, digest)
    ├── OnnxModelError             an ONNX model cannot be served
    └── Closed / Broken            "you closed it" vs "the peer broke it" (trio's naming)
        └── StreamAborted          (Broken) a consumer fell too far behind its stream

    ModelLoadError (Exception)     a model could not be loaded at start: the server exits
    WouldBlock (Exception)         a ``*_nowait`` operation would have had to wait
    ConfigWarning (UserWarning)    a ``ZEROSERVE_*`` variable names no configuration key

Each API renders these in its own error format (OpenAI, KServe, plain JSON); the
``code`` is a short machine-readable identifier and ``param`` names the offending field.
"""

from __future__ import annotations


class ZeroserveError(Exception):
    """Base class. ``status`` is the HTTP status the error maps to."""

    status: int = 500
    code: str = "internal_error"
    type: str = "server_error"

    def __init__(
        self,
        message: str,
        *,
        status: int | None = None,
        code: str | None = None,
        param: str | None = None,
        headers: list[tuple[bytes, bytes]] | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        if status is not None:
            self.status = status
        if code is not None:
            self.code = code
        self.param = param
        self.headers: list[tuple[bytes, bytes]] = headers or []


class ProtocolError(ZeroserveError):
    """The peer sent bytes that are not valid HTTP/1.1 (or exceed a limit). The
    connection always closes after the error response: the framing can no longer be
    trusted (RFC 9112 §6.3)."""

    status = 400
    code = "bad_request"
    type = "invalid_request_error"

    _CODES = {
        408: "request_timeout",
        413: "payload_too_large",
        414: "uri_too_long",
        417: "expectation_failed",
        431: "headers_too_large",
        501: "not_implemented",
        505: "http_version_not_supported",
    }

    def __init__(self, message: str, *, status: int = 400) -> None:
        super().__init__(message, status=status, code=self._CODES.get(status, "bad_request"))
        # The request's path, where the head was valid enough to tell it (a body over
        # the limit): the answer is then in that route's error format.
        self.path: str | None = None


class RequestError(ZeroserveError):
    status = 400
    code = "invalid_request"
    type = "invalid_request_error"


class CapabilityError(RequestError):
    code = "unsupported_capability"


class NotFound(ZeroserveError):
    status = 404
    code = "not_found"
    type = "invalid_request_error"


class ModelNotFound(NotFound):
    code = "model_not_found"


class Unauthorized(ZeroserveError):
    """The request carries no API key, a malformed one, or one we do not know. The
    message never repeats the credential that was sent."""

    status = 401
    code = "invalid_api_key"
    type = "invalid_request_error"

    def __init__(self, message: str) -> None:
        super().__init__(message, headers=[(b"www-authenticate", b'Bearer realm="zeroserve"')])


class Forbidden(ZeroserveError):
    """The caller is known (or local) but may not do this: the admin-only model control
    routes (docs/architecture.md, "Models at run time")."""

    status = 403
    code = "permission_denied"
    type = "invalid_request_error"


class MethodNotAllowed(ZeroserveError):
    status = 405
    code = "method_not_allowed"
    type = "invalid_request_error"

    def __init__(self, message: str, allow: list[str]) -> None:
        super().__init__(message, headers=[(b"allow", ", ".join(allow).encode("ascii"))])
        self.allow = allow


class Conflict(ZeroserveError):
    status = 409
    code = "conflict"
    type = "invalid_request_error"


class PayloadTooLarge(ZeroserveError):
    status = 413
    code = "payload_too_large"
    type = "invalid_request_error"


class Overloaded(ZeroserveError):
    """Admission refused the request. 429 when one model is saturated, 503 for the server."""

    status = 429
    code = "overloaded"
    type = "rate_limit_error"

    def __init__(self, message: str, *, status: int = 429, retry_after: float = 1.0) -> None:
        seconds = max(1, int(retry_after + 0.999))
        super().__init__(
            message, status=status, headers=[(b"retry-after", str(seconds).encode("ascii"))]
        )
        self.retry_after = retry_after


class RateLimited(Overloaded):
    """An API key's quota refused the request. ``headers`` carry ``Retry-After`` (the
    key's own refill time) and the OpenAI ``x-ratelimit-*`` headers."""

    code = "rate_limit_exceeded"

    def __init__(
        self, message: str, *, retry_after: float, headers: list[tuple[bytes, bytes]]
    ) -> None:
        super().__init__(message, status=429, retry_after=retry_after)
        self.headers += headers


class DeadlineExceeded(ZeroserveError):
    status = 504
    code = "deadline_exceeded"
    type = "timeout_error"


class WorkerError(ZeroserveError):
    status = 500
    code = "worker_failed"


class UpstreamError(ZeroserveError):
    status = 502
    code = "upstream_error"


class Closed(ZeroserveError):
    """This side closed the resource (a channel, the server) and then used it."""

    code = "closed"


class Broken(ZeroserveError):
    """The other side went away (client disconnect, worker death)."""

    code = "broken"


class StreamAborted(Broken):
    """The consumer fell so far behind a stream that never waits for it (a ``coalesce``
    channel past its byte cap, an engine's slot past its pending bytes) that it was
    aborted."""

    code = "stream_aborted"


class UpstreamUnreachable(UpstreamError):
    """Nothing was answered: the connection was refused, timed out, or closed before the
    first response byte. The request may go to another upstream."""

    code = "upstream_unreachable"


class UpstreamUnavailable(ZeroserveError):
    """503: every upstream of the model is ejected."""

    status = 503
    code = "upstream_unavailable"


class ClusterUnavailable(ZeroserveError):
    """503: the cluster a model's workers run on (Ray) cannot be reached; new requests
    are refused at once with ``Retry-After`` instead of waiting for their deadline."""

    status = 503
    code = "cluster_unavailable"

    def __init__(self, message: str, *, status: int = 503, retry_after: float = 1.0) -> None:
        seconds = max(1, int(retry_after + 0.999))
        super().__init__(
            message, status=status, headers=[(b"retry-after", str(seconds).encode("ascii"))]
        )
        self.retry_after = retry_after


class ConfigError(ZeroserveError):
    code = "invalid_config"


class SpecError(ZeroserveError):
    code = "invalid_model_spec"


class ModelFileError(ZeroserveError):
    """A model file is missing or is not the pinned one (the server cannot start it)."""

    status = 500
    code = "model_file_error"


class GGUFError(ModelFileError):
    """A GGUF file that cannot be served: missing, not a GGUF file, not the pinned
    digest, or refused by the engine's loader."""

    code = "gguf_error"


class OnnxModelError(ZeroserveError):
    code = "onnx_model_error"


class ModelLoadError(Exception):
    """A model could not be loaded at start (its ``load`` raised, or it timed out)."""

    def __init__(self, model: str, cause: str) -> None:
        super().__init__(f"model {model!r} failed to load: {cause}")
        self.model = model
        self.cause = cause


class WouldBlock(Exception):
    """Raised by ``*_nowait`` operations that would have had to wait."""


class ConfigWarning(UserWarning):
    """A ``ZEROSERVE_*`` environment variable names no configuration key (ignored)."""


def error_class(name: str) -> type[ZeroserveError] | None:
    """The ``ZeroserveError`` subclass called ``name`` (how a worker's error crosses the
    process boundary: by class name), or None."""
    todo: list[type[ZeroserveError]] = [ZeroserveError]
    while todo:
        cls = todo.pop()
        if cls.__name__ == name:
            return cls
        todo += cls.__subclasses__()
    return None
