"""Error bodies in each API's own format. No error body ever echoes the request input.

* ``openai``: ``{"error": {"message", "type", "param", "code"}}`` (also the default).
* ``kserve``: ``{"error": "<message>"}`` (Open Inference Protocol).
"""

from __future__ import annotations

from typing import Literal

import msgspec

from ..errors import ZeroserveError
from .response import JSON, Response

ErrorFormat = Literal["openai", "kserve", "plain"]

_encoder = msgspec.json.Encoder()


def error_body(exc: ZeroserveError, fmt: ErrorFormat, request_id: bytes = b"") -> bytes:
    """The body for ``exc``; a request id (checked well-formed at the head) ends the
    message, so a user can quote it, without changing the API's error shape."""
    message = exc.message
    if request_id:
        message = f"{message} (request id {request_id.decode('ascii')})"
    if fmt == "kserve":
        return _encoder.encode({"error": message})
    return _encoder.encode(
        {"error": {"message": message, "type": exc.type, "param": exc.param, "code": exc.code}}
    )


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
