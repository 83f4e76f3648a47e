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


def error_body(exc: ZeroserveError, fmt: ErrorFormat) -> bytes:
    if fmt == "kserve":
        return _encoder.encode({"error": exc.message})
    return _encoder.encode(
        {"error": {"message": exc.message, "type": exc.type, "param": exc.param, "code": exc.code}}
    )


def error_response(exc: ZeroserveError, fmt: ErrorFormat = "openai") -> Response:
    return Response(
        exc.status, [error_body(exc, fmt)], content_type=JSON, headers=list(exc.headers)
    )


def internal_error(fmt: ErrorFormat = "openai") -> Response:
    return error_response(ZeroserveError("internal server error"), fmt)
