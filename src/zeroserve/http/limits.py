"""HTTP limits and timeouts. Every default is a named constant with its unit and reason."""

from __future__ import annotations

from dataclasses import dataclass

# Request head (request line + headers), bytes. h11 and Node.js use 16 KiB; nginx's
# large_client_header_buffers allows 4 x 8 KiB. Past it: 431.
MAX_HEAD_BYTES = 16 * 1024
# Header fields per request. Apache's LimitRequestFields is 100. Past it: 431.
MAX_HEADERS = 100
# Request target, bytes. Apache's LimitRequestLine and nginx allow about 8 KiB. Past it: 414.
MAX_URI_BYTES = 8 * 1024
# Request body from Content-Length (or decoded chunked), bytes. Large enough for a 64 MiB
# tensor with its JSON header; anything bigger should be chunked into several requests.
MAX_BODY_BYTES = 128 * 1024 * 1024
# First receive window for a request head, bytes. A head is read into a small window that
# doubles until the blank line is found, so that body bytes read together with the head
# (which must be copied into the body buffer) stay a small share of the body: at most
# ~1 KiB, i.e. <= 1.6 % of a 64 KiB body. Typical heads (curl, wrk, httpx) are 100-400 B;
# the openai SDK's is ~700 B.
HEAD_WINDOW_BYTES = 1024
# Longest chunk-size or trailer line in a chunked body, bytes; hyper and h11 allow ~4 KiB.
MAX_CHUNK_LINE_BYTES = 4096
# A request answered before its body was read (404, 429, ...) keeps its connection if
# its Content-Length body is at most this many bytes: reading and dropping 64 KiB costs
# less than the client's reconnect (a new TCP handshake, under overload at that).
DISCARD_MAX_BYTES = 64 * 1024


@dataclass(frozen=True, slots=True)
class HttpLimits:
    """Per-connection protocol limits (bytes and counts)."""

    max_head_bytes: int = MAX_HEAD_BYTES
    max_headers: int = MAX_HEADERS
    max_uri_bytes: int = MAX_URI_BYTES
    max_body_bytes: int = MAX_BODY_BYTES
    head_window_bytes: int = HEAD_WINDOW_BYTES

    def __post_init__(self) -> None:
        if self.max_uri_bytes >= self.max_head_bytes:
            object.__setattr__(self, "max_uri_bytes", self.max_head_bytes - 64)
        if self.head_window_bytes > self.max_head_bytes:
            object.__setattr__(self, "head_window_bytes", self.max_head_bytes)
