"""Where a request's priority class comes from (docs/architecture.md, "Priority classes").

A class is an integer, lower first (vLLM's ``priority``; runtime/classes.py orders the
waits by it). A request asks for one in its body's ``priority`` field (the OpenAI
routes: chat, completions, embeddings, responses) or in an ``x-priority`` header (any
route, so also Anthropic's Messages, KServe V2 and raw); the field wins over the header.
A request that asks for nothing gets its API key's ``priority`` (the keys file), else
the default class. A key's ``priority_min`` is the highest class (lowest number) its
requests may ask for: asking above it is a 400 naming the field or header, never a
silent clamp, as a class outside the runtime's range is.
"""

from __future__ import annotations

from typing import Final

from ..edge import ApiKey
from ..errors import RequestError
from ..runtime.classes import DEFAULT_PRIORITY, MAX_PRIORITY, MIN_PRIORITY, Priority

# The header a request names its class in (any route).
PRIORITY_HEADER: Final = b"x-priority"
# Longest header value read as a class: a sign and the digits of the widest class.
_MAX_HEADER_BYTES: Final = 8


def key_default(key: ApiKey | None) -> Priority:
    """The class of a request that asks for none."""
    if key is not None and key.priority is not None:
        return key.priority
    return DEFAULT_PRIORITY


def head_priority(header: bytes | None, key: ApiKey | None) -> Priority:
    """The class a request's head asks for (``x-priority``), else its key's default;
    ``RequestError`` (400) naming the header when it is not a class this key may ask."""
    if header is None:
        return key_default(key)
    value = header.strip()
    if not value or len(value) > _MAX_HEADER_BYTES or not value.lstrip(b"-+").isdigit():
        raise RequestError(
            f"the x-priority header must be an integer from {MIN_PRIORITY} to {MAX_PRIORITY} "
            "(lower runs first)",
            param="x-priority",
        )
    return checked(int(value), key, "x-priority")


def checked(value: int, key: ApiKey | None, name: str) -> Priority:
    """``value`` if it is a class and the key allows it, else a 400 naming ``name``."""
    if not MIN_PRIORITY <= value <= MAX_PRIORITY:
        raise RequestError(
            f"{name} must be an integer from {MIN_PRIORITY} to {MAX_PRIORITY} (lower runs first)",
            param=name,
        )
    cap = key.priority_min if key is not None else None
    if cap is not None and value < cap:
        raise RequestError(
            f"{name} asks for a higher class than this API key may: its requests may ask "
            f"for priority {cap} or higher numbers (lower runs first)",
            param=name,
        )
    return value
