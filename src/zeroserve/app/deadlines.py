"""Per-request deadlines: what the client asks for, capped by the server's limit.

Every route turns the client's timeout into an absolute deadline on the engine's clock
with ``handle.deadline(timeout_s)``, which caps it by the model's ``deadline_s`` (itself
the server's ``--request-timeout`` unless the model sets its own). The client's wish can
only shorten a request's life, never lengthen it (see ``docs/architecture.md``,
"Deadlines").

* OpenAI routes: ``X-Stainless-Timeout`` (the whole request) or
  ``X-Stainless-Read-Timeout`` (the wait for the next byte), the headers the official
  SDKs send with the client's own ``timeout=`` (seconds): work the client will no longer
  wait for is wasted. A read timeout bounds a whole response but not a stream (whose
  every piece restarts the client's clock), so it applies to non-streamed requests only.
  The server answers at ``CLIENT_TIMEOUT_SHARE`` of the client's timeout, so the 504
  arrives before the client gives up.
* Raw: ``?timeout=`` (seconds) or a ``Request-Timeout`` header (seconds).
* KServe V2: ``parameters.timeout`` (microseconds, Triton's), parsed in the endpoint.

An expired request is a 504 (``DeadlineExceeded``) in the API's own format; a stream
that expires after its head ends with an error event.
"""

from __future__ import annotations

import math

from ..errors import RequestError
from .limits import MAX_TIMEOUT_S
from .request import Request

# Headers the OpenAI SDKs send with the client's timeout, in seconds (Stainless-generated
# SDKs: ``x-stainless-timeout``; openai-python sends the read timeout).
OPENAI_TIMEOUT_HEADERS = (b"x-stainless-timeout", b"x-stainless-read-timeout")
# The raw API's header (seconds); ``?timeout=`` wins when both are given.
RAW_TIMEOUT_HEADER = b"request-timeout"
# Share of an SDK client's timeout the server's deadline takes: an answer that arrives
# after the client gave up is wasted, and a 504 is clearer to it than its own timeout.
# The remaining tenth covers the network and the client's scheduling.
CLIENT_TIMEOUT_SHARE = 0.9


def parse_seconds(text: str | bytes, param: str) -> float:
    """A timeout in seconds: a finite number > 0 and at most ``MAX_TIMEOUT_S``."""
    try:
        value = float(text)
    except (ValueError, UnicodeDecodeError):
        raise RequestError(f"{param} must be a number of seconds", param=param) from None
    if not math.isfinite(value) or value <= 0 or value > MAX_TIMEOUT_S:
        raise RequestError(
            f"{param} must be more than 0 and at most {MAX_TIMEOUT_S:g} seconds", param=param
        )
    return value


def openai_timeout(req: Request, *, stream: bool = False) -> float | None:
    """The deadline (seconds from now) the OpenAI SDK headers ask for, or None.

    A malformed SDK header is ignored rather than refused: it is metadata the client
    library adds, not something the caller wrote, and the server's limit still applies.
    """
    for name in OPENAI_TIMEOUT_HEADERS[: 1 if stream else 2]:
        value = req.header(name)
        if value is not None:
            try:
                return parse_seconds(value, name.decode()) * CLIENT_TIMEOUT_SHARE
            except RequestError:
                return None
    return None


def raw_timeout(req: Request) -> float | None:
    """The raw route's ``?timeout=`` or ``Request-Timeout`` header, or None; malformed
    values are a 400 (the caller wrote them)."""
    query = req.query.get("timeout")
    if query is not None:
        return parse_seconds(query, "timeout")
    header = req.header(RAW_TIMEOUT_HEADER)
    if header is not None:
        return parse_seconds(header, "request-timeout")
    return None
