"""Error bodies in each API's own format. No error body ever echoes the request input.

* ``openai``: ``{"error": {"message", "type", "param", "code"}}`` (also the default).
* ``kserve``: ``{"error": "<message>"}`` (Open Inference Protocol).
* ``anthropic``: ``{"type": "error", "error": {"type", "message"}}``, the type named
  by the status as Anthropic's API names it (``ANTHROPIC_TYPES``; other 4xx are
  ``invalid_request_error``, other 5xx ``api_error``).
"""

from __future__ import annotations

from typing import Literal

import msgspec

from ..errors import ZeroserveError
from .response import JSON, Response

ErrorFormat = Literal["openai", "kserve", "anthropic", "plain"]

# Anthropic's error types by status (its API's "HTTP errors" table; 503 is our
# overloaded server, which Anthropic answers with 529).
ANTHROPIC_TYPES: dict[int, str] = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    500: "api_error",
    503: "overloaded_error",
    504: "timeout_error",
    529: "overloaded_error",
}

_encoder = msgspec.json.Encoder()


def error_body(exc: ZeroserveError, fmt: ErrorFormat, request_id: bytes = b"") -> bytes:
    """The body for ``exc``; a request id (checked well-formed at the head) ends the
    message, so a user can quote it, without changing the API's error shape."""
    message = exc.message
    if request_id:
        message = f"{message} (request id {request_id.decode('ascii')})"
    if fmt == "kserve":
        return _encoder.encode({"error": message})
    if fmt == "anthropic":
        # Anthropic's errors have no ``param``: its messages start with the field's path.
        param = exc.param
        if param is not None and param not in message:
            message = f"{param}: {message}"
        return _encoder.encode(
            {"type": "error", "error": {"type": anthropic_type(exc.status), "message": message}}
        )
    return _encoder.encode(
        {"error": {"message": message, "type": exc.type, "param": exc.param, "code": exc.code}}
    )


def anthropic_type(status: int) -> str:
    """Anthropic's error type for an HTTP status."""
    kind = ANTHROPIC_TYPES.get(status)
    if kind is not None:
        return kind
    return "invalid_request_error" if status < 500 else "api_error"


def error_response(
    exc: ZeroserveError, fmt: ErrorFormat = "openai", request_id: bytes = b""
) -> Response:
    return Response(
        exc.status,
        [error_body(exc, fmt, request_id)],
        content_type=JSON,
        headers=list(exc.headers),
    )


def internal_error(fmt: ErrorFormat = "openai", request_id: bytes = b"") -> Response:
    return error_response(ZeroserveError("internal server error"), fmt, request_id)
