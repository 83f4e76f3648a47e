"""Chunked bodies shared by the server role's and the client role's tests: one decoder,
one table (RFC 9112 §7.1)."""

from __future__ import annotations

# (name, chunked body, decoded body)
VALID_CHUNKED: list[tuple[str, bytes, bytes]] = [
    (
        "chunked",
        b"5;ext=1\r\nhello\r\n1\r\n \r\n5\r\nworld\r\n0\r\nX-Trailer: t\r\n\r\n",
        b"hello world",
    ),
    ("chunked-upper-hex", b"A\r\n0123456789\r\n0\r\n\r\n", b"0123456789"),
    ("chunked-size-padding", b"05 \t;a=b\r\nhello\r\n000\r\n\r\n", b"hello"),
]

# (name, chunked body, status a server answers). The server role runs them with a body
# limit of 1024 bytes; the client role has no body limit, so 413 rows are server-only.
INVALID_CHUNKED: list[tuple[str, bytes, int]] = [
    ("chunk-size-bad", b"zz\r\n", 400),
    ("chunk-size-empty", b"\r\n", 400),
    ("chunk-size-huge", b"11111111111111111\r\n", 400),
    ("chunk-size-negative", b"-1\r\n", 400),
    ("chunk-size-plus", b"+5\r\nhello\r\n0\r\n\r\n", 400),
    ("chunk-size-0x", b"0x5\r\nhello\r\n0\r\n\r\n", 400),
    ("chunk-size-inner-space", b"5 5\r\n", 400),
    ("chunk-no-crlf", b"2\r\nhiXX0\r\n\r\n", 400),
    ("chunk-data-bare-lf", b"2\r\nhi\n0\r\n\r\n", 400),
    ("chunk-size-bare-lf", b"5\nhello\r\n0\r\n\r\n", 400),
    ("chunk-line-too-long", b"1;" + b"e" * 5000, 400),
    ("trailer-line-too-long", b"0\r\nx: " + b"a" * 5000, 431),
    ("trailer-bare-lf", b"0\r\nx: y\n\r\n", 400),
    ("chunked-too-large", b"401\r\n" + b"x" * 1025 + b"\r\n0\r\n\r\n", 413),
]
