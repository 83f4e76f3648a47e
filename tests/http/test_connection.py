"""Table-driven tests of the sans-I/O request parser: every case is fed whole, one byte
at a time, and followed by trailing bytes (after h11's test_io.py)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.http.driver import feed
from tests.http.tables import INVALID_CHUNKED, VALID_CHUNKED
from zeroserve.errors import ProtocolError
from zeroserve.http import HttpConnection, HttpLimits, State

H = b"Host: example\r\n"

VALID: list[tuple[str, bytes, list[tuple[str, str, bytes]]]] = [
    ("get", b"GET /health HTTP/1.1\r\n" + H + b"\r\n", [("GET", "/health", b"")]),
    (
        "post-cl",
        b"POST /v1/raw/echo HTTP/1.1\r\n" + H + b"Content-Length: 5\r\n\r\nhello",
        [("POST", "/v1/raw/echo", b"hello")],
    ),
    (
        "post-cl-zero",
        b"POST /x HTTP/1.1\r\n" + H + b"Content-Length: 0\r\n\r\n",
        [("POST", "/x", b"")],
    ),
    *[
        (
            name,
            b"POST /c HTTP/1.1\r\n" + H + b"Transfer-Encoding: Chunked\r\n\r\n" + body,
            [("POST", "/c", decoded)],
        )
        for name, body, decoded in VALID_CHUNKED
    ],
    (
        "pipelined",
        b"GET /a HTTP/1.1\r\n" + H + b"\r\n"
        b"POST /b HTTP/1.1\r\n" + H + b"Content-Length: 3\r\n\r\nabc"
        b"POST /c HTTP/1.1\r\n" + H + b"Transfer-Encoding: chunked\r\n\r\n2\r\nhi\r\n0\r\n\r\n"
        b"GET /d HTTP/1.1\r\n" + H + b"\r\n",
        [("GET", "/a", b""), ("POST", "/b", b"abc"), ("POST", "/c", b"hi"), ("GET", "/d", b"")],
    ),
    ("leading-crlf", b"\r\nGET / HTTP/1.1\r\n" + H + b"\r\n", [("GET", "/", b"")]),
    ("http10", b"GET /old HTTP/1.0\r\n\r\n", [("GET", "/old", b"")]),
    (
        "absolute-form",
        b"GET http://example/p/q?x=1 HTTP/1.1\r\n" + H + b"\r\n",
        [("GET", "/p/q", b"")],
    ),
    (
        "percent-path",
        b"GET /v2/models/my%20model HTTP/1.1\r\n" + H + b"\r\n",
        [("GET", "/v2/models/my model", b"")],
    ),
    ("host-port-ipv6", b"GET / HTTP/1.1\r\nHost: [::1]:8000\r\n\r\n", [("GET", "/", b"")]),
    ("empty-host", b"GET / HTTP/1.1\r\nHost:\r\n\r\n", [("GET", "/", b"")]),
]

INVALID: list[tuple[str, bytes, int]] = [
    (
        "cl-and-te",
        b"POST / HTTP/1.1\r\n" + H + b"Content-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n",
        400,
    ),
    (
        "te-and-cl",
        b"POST / HTTP/1.1\r\n" + H + b"Transfer-Encoding: chunked\r\nContent-Length: 5\r\n\r\n",
        400,
    ),
    (
        "dup-cl-same",
        b"POST / HTTP/1.1\r\n" + H + b"Content-Length: 5\r\nContent-Length: 5\r\n\r\nhello",
        400,
    ),
    (
        "dup-cl-diff",
        b"POST / HTTP/1.1\r\n" + H + b"Content-Length: 5\r\nContent-Length: 6\r\n\r\n",
        400,
    ),
    ("cl-plus", b"POST / HTTP/1.1\r\n" + H + b"Content-Length: +5\r\n\r\n", 400),
    ("cl-neg", b"POST / HTTP/1.1\r\n" + H + b"Content-Length: -5\r\n\r\n", 400),
    ("cl-alpha", b"POST / HTTP/1.1\r\n" + H + b"Content-Length: 5a\r\n\r\n", 400),
    ("cl-list", b"POST / HTTP/1.1\r\n" + H + b"Content-Length: 5, 5\r\n\r\n", 400),
    ("te-gzip", b"POST / HTTP/1.1\r\n" + H + b"Transfer-Encoding: gzip\r\n\r\n", 400),
    (
        "te-chunked-gzip",
        b"POST / HTTP/1.1\r\n" + H + b"Transfer-Encoding: chunked, gzip\r\n\r\n",
        400,
    ),
    (
        "te-double-chunked",
        b"POST / HTTP/1.1\r\n"
        + H
        + b"Transfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n\r\n",
        400,
    ),
    ("te-http10", b"POST / HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n", 400),
    *[
        (name, b"POST / HTTP/1.1\r\n" + H + b"Transfer-Encoding: chunked\r\n\r\n" + body, status)
        for name, body, status in INVALID_CHUNKED
    ],
    ("no-host", b"GET / HTTP/1.1\r\n\r\n", 400),
    ("dup-host", b"GET / HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n", 400),
    ("bad-host-space", b"GET / HTTP/1.1\r\nHost: a b\r\n\r\n", 400),
    ("bad-host-slash", b"GET / HTTP/1.1\r\nHost: a/b\r\n\r\n", 400),
    ("bad-host-at", b"GET / HTTP/1.1\r\nHost: user@a\r\n\r\n", 400),
    ("bad-header-name", b"GET / HTTP/1.1\r\n" + H + b"Bad Name: x\r\n\r\n", 400),
    ("header-name-colon-space", b"GET / HTTP/1.1\r\n" + H + b"X :x\r\n\r\n", 400),
    ("bad-header-value-nul", b"GET / HTTP/1.1\r\n" + H + b"X: a\x00b\r\n\r\n", 400),
    ("bad-header-value-ctl", b"GET / HTTP/1.1\r\n" + H + b"X: a\x01b\r\n\r\n", 400),
    ("obs-fold", b"GET / HTTP/1.1\r\n" + H + b"X: a\r\n b\r\n\r\n", 400),
    ("bare-lf", b"GET / HTTP/1.1\nHost: a\n\n", 400),
    ("bad-version", b"GET / HTTP/1.2\r\n" + H + b"\r\n", 400),
    ("http2-version", b"GET / HTTP/2.0\r\n" + H + b"\r\n", 505),
    ("bad-method", b"BREW / HTTP/1.1\r\n" + H + b"\r\n", 501),
    ("space-in-target", b"GET /a b HTTP/1.1\r\n" + H + b"\r\n", 400),
    ("ctl-in-target", b"GET /a\x01 HTTP/1.1\r\n" + H + b"\r\n", 400),
    ("bad-percent-utf8", b"GET /%ff HTTP/1.1\r\n" + H + b"\r\n", 400),
    (
        "expect-unknown",
        b"POST / HTTP/1.1\r\n" + H + b"Expect: 200-ok\r\nContent-Length: 1\r\n\r\nx",
        417,
    ),
    ("body-too-large", b"POST / HTTP/1.1\r\n" + H + b"Content-Length: 1025\r\n\r\n", 413),
    ("head-too-large", b"GET / HTTP/1.1\r\n" + H + b"X: " + b"a" * 3000 + b"\r\n\r\n", 431),
    ("head-too-large-unterminated", b"GET / HTTP/1.1\r\n" + H + b"X: " + b"a" * 3000, 431),
    (
        "too-many-headers",
        b"GET / HTTP/1.1\r\n" + H + b"".join(b"X%d: y\r\n" % i for i in range(30)) + b"\r\n",
        431,
    ),
    ("uri-too-long", b"GET /" + b"a" * 1500 + b" HTTP/1.1\r\n" + H + b"\r\n", 414),
    ("uri-too-long-unterminated", b"GET /" + b"a" * 1500, 414),
]

SMALL = HttpLimits(max_head_bytes=2048, max_headers=20, max_uri_bytes=1024, max_body_bytes=1024)
STEPS = [None, 1, 7]


def _ids(cases: list[tuple[str, object, object]]) -> list[str]:
    return [c[0] for c in cases]


@pytest.mark.parametrize("step", STEPS, ids=["whole", "bytewise", "step7"])
@pytest.mark.parametrize(("name", "data", "expected"), VALID, ids=_ids(VALID))
def test_valid(
    name: str, data: bytes, expected: list[tuple[str, str, bytes]], step: int | None
) -> None:
    out = feed(data, step=step, limits=SMALL)
    got = [(r.head.method, r.head.path, r.body) for r in out.requests]
    assert got == expected


@pytest.mark.parametrize(("name", "data", "expected"), VALID, ids=_ids(VALID))
def test_valid_with_trailing_bytes(
    name: str, data: bytes, expected: list[tuple[str, str, bytes]]
) -> None:
    # A partial next request after the complete ones: parsed requests are unchanged and the
    # partial bytes stay buffered.
    trailing = b"GET /next HTTP/1.1\r\nHost: a\r\n"
    out = feed(data + trailing, limits=SMALL)
    keep_alive = all(r.head.keep_alive for r in out.requests)
    assert [(r.head.method, r.head.path, r.body) for r in out.requests] == expected
    if keep_alive:
        assert out.leftover == len(trailing)


@pytest.mark.parametrize("step", STEPS, ids=["whole", "bytewise", "step7"])
@pytest.mark.parametrize(("name", "data", "status"), INVALID, ids=_ids(INVALID))
def test_invalid(name: str, data: bytes, status: int, step: int | None) -> None:
    with pytest.raises(ProtocolError) as info:
        feed(data, step=step, limits=SMALL)
    assert info.value.status == status


@pytest.mark.parametrize(("name", "data", "status"), INVALID, ids=_ids(INVALID))
def test_invalid_with_trailing_bytes(name: str, data: bytes, status: int) -> None:
    with pytest.raises(ProtocolError) as info:
        feed(data + b"GET / HTTP/1.1\r\nHost: a\r\n\r\n" * 3, limits=SMALL)
    assert info.value.status == status


def test_head_fields() -> None:
    data = (
        b"POST /v1/raw/echo?stream=1&x=%20 HTTP/1.1\r\nHost: a\r\nContent-Length: 2\r\n"
        b"Expect: 100-continue\r\nConnection: close\r\nX-Mixed-Case: Value\r\n\r\nok"
    )
    (req,) = feed(data).requests
    head = req.head
    assert head.query == "stream=1&x=%20"
    assert head.expect_continue and not head.keep_alive
    assert head.header(b"x-mixed-case") == b"Value"
    assert head.content_length == 2 and not head.chunked


def test_a_bad_host_is_refused_after_a_good_one_on_the_same_connection() -> None:
    # A Host value is checked once per connection while it repeats; a new value is checked.
    good = b"GET /a HTTP/1.1\r\nHost: a.example:8000\r\n\r\n"
    conn_data = good * 2 + b"GET /b HTTP/1.1\r\nHost: a b\r\n\r\n"
    with pytest.raises(ProtocolError) as info:
        feed(conn_data)
    assert info.value.status == 400 and "Host" in str(info.value)
    (one, two) = feed(good * 2).requests
    assert one.head.path == two.head.path == "/a"


@pytest.mark.parametrize(
    ("line", "version"),
    [(b"GET / HTTP/1.1", "1.1"), (b"GET / HTTP/1.0", "1.0"), (b"GET /HTTP/1.1x HTTP/1.0", "1.0")],
)
def test_the_version_is_the_request_lines_last_token(line: bytes, version: str) -> None:
    (req,) = feed(line + b"\r\nHost: a\r\n\r\n").requests
    assert req.head.version == version


@pytest.mark.parametrize(
    "spelling", [b"Content-Type", b"content-type", b"CONTENT-TYPE", b"cOnTeNt-TyPe"]
)
def test_header_names_arrive_lower_case_however_spelled(spelling: bytes) -> None:
    # Common names map to one shared lower-case object, any other is lower-cased.
    data = (
        b"GET / HTTP/1.1\r\nHost: a\r\n" + spelling + b": text/plain\r\n"
        b"X-Request-ID: r1\r\nX-Other-Thing: v\r\n\r\n"
    )
    (req,) = feed(data).requests
    names = [k for k, _ in req.head.headers]
    assert names == [b"host", b"content-type", b"x-request-id", b"x-other-thing"]
    assert req.head.header(b"content-type") == b"text/plain"
    assert req.head.header(b"x-request-id") == b"r1"


@pytest.mark.parametrize(
    ("data", "keep_alive"),
    [
        (b"GET / HTTP/1.1\r\nHost: a\r\n\r\n", True),
        (b"GET / HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n", False),
        (b"GET / HTTP/1.1\r\nHost: a\r\nConnection: Keep-Alive, Close\r\n\r\n", False),
        (b"GET / HTTP/1.0\r\n\r\n", False),
        (b"GET / HTTP/1.0\r\nConnection: keep-alive\r\n\r\n", True),
    ],
)
def test_keep_alive(data: bytes, keep_alive: bool) -> None:
    (req,) = feed(data).requests
    assert req.head.keep_alive is keep_alive


def test_close_stops_parsing_pipelined_requests() -> None:
    data = (
        b"GET /a HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\nGET /b HTTP/1.1\r\nHost: a\r\n\r\n"
    )
    out = feed(data)
    assert [r.head.path for r in out.requests] == ["/a"]


def test_content_length_body_lands_in_the_given_buffer() -> None:
    conn = HttpConnection()
    head = b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 100000\r\n\r\n"
    buf = conn.next_buffer()
    assert len(buf) == conn.limits.head_window_bytes  # small first window
    buf[: len(head)] = head
    ev = conn.buffer_updated(len(head))
    assert ev is not None
    body = bytearray(100000)
    assert conn.receive_into(memoryview(body)) is None
    # From now on the connection hands out the body buffer itself, at its offset.
    view = conn.next_buffer()
    assert view.obj is body and len(view) == 100000
    view[:100000] = b"z" * 100000
    assert conn.buffer_updated(100000) is not None
    assert conn.state is State.HANDLING and conn.overflow_copied == 0


def test_head_window_bounds_the_overflow_copy() -> None:
    conn = HttpConnection()
    data = b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 65536\r\n\r\n" + b"b" * 65536
    buf = conn.next_buffer()
    n = len(buf)
    buf[:n] = data[:n]
    conn.buffer_updated(n)
    body = bytearray(65536)
    conn.receive_into(memoryview(body))
    assert conn.overflow_copied <= conn.limits.head_window_bytes
    assert conn.overflow_copied / 65536 < 0.02


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=600), st.sampled_from([None, 1, 13]))
def test_any_bytes_parse_or_raise_protocol_error(data: bytes, step: int | None) -> None:
    try:
        feed(data, step=step, limits=SMALL)
    except ProtocolError as exc:
        assert 400 <= exc.status < 600


request_lines = st.sampled_from(
    [b"GET / HTTP/1.1\r\n", b"POST /x HTTP/1.1\r\n", b"GET / HTTP/1.0\r\n"]
)
header_lines = st.lists(
    st.sampled_from(
        [
            b"Host: a\r\n",
            b"Content-Length: 3\r\n",
            b"Transfer-Encoding: chunked\r\n",
            b"Connection: close\r\n",
            b"Expect: 100-continue\r\n",
            b"X: \xff\r\n",
            b"Content-Length: x\r\n",
        ]
    ),
    max_size=5,
)


@settings(max_examples=300, deadline=None)
@given(request_lines, header_lines, st.binary(max_size=40))
def test_structured_requests_parse_or_raise_protocol_error(
    line: bytes, headers: list[bytes], tail: bytes
) -> None:
    try:
        feed(line + b"".join(headers) + b"\r\n" + tail, limits=SMALL)
    except ProtocolError as exc:
        assert 400 <= exc.status < 600
