"""Request ids: the client's ``X-Request-Id`` when it is well formed, else a new one.

A well-formed id is 1 to ``MAX_REQUEST_ID_BYTES`` characters from a conservative set
(letters, digits and ``-_.:/+=@``), so it can go into a header, a JSON log line and an
error body without escaping, and a 10 KiB or control-character header is never echoed.
New ids are a random per-process prefix plus a counter: unique across the workers of
one server and across restarts, and a few hundred nanoseconds to make (no ``uuid4``).
"""

from __future__ import annotations

import os
import re
from typing import Final

# Longest client id kept, bytes. UUIDs are 36, AWS X-Ray and W3C trace ids 35-55;
# 128 leaves room for a prefix while keeping log lines and headers bounded.
MAX_REQUEST_ID_BYTES = 128
_WELL_FORMED = re.compile(rb"[A-Za-z0-9\-_.:/+=@]{1,%d}\Z" % MAX_REQUEST_ID_BYTES)
HEADER: Final = b"x-request-id"  # Final: read per request (see keys.py)


class RequestIds:
    """Makes request ids; ``take(client_value)`` keeps a well-formed client id."""

    __slots__ = ("_next", "_prefix")

    def __init__(self, prefix: bytes | None = None) -> None:
        prefix = prefix if prefix is not None else os.urandom(6).hex().encode("ascii")
        self._prefix = prefix + b"-"
        self._next = 0

    def new(self) -> bytes:
        self._next += 1
        return self._prefix + b"%x" % self._next

    def take(self, client_value: bytes | None) -> bytes:
        if client_value is not None and well_formed(client_value):
            return client_value
        return self.new()


def well_formed(value: bytes) -> bool:
    return len(value) <= MAX_REQUEST_ID_BYTES and _WELL_FORMED.match(value) is not None
