"""The response side of the server connection, fed bytes (no sockets): framing choice,
keep-alive, HEAD, HTTP/1.0 streaming, 100-continue, early answers with discard, and the
stream framer's output."""

from __future__ import annotations

import itertools

import pytest

from tests.http.driver import pump
from zeroserve import metrics
from zeroserve.http import HttpConnection, RequestHead, State, StreamFramer
from zeroserve.http.framing import CONTINUE, GATHER_MAX_BYTES, GATHER_MIN_BUFFERS, LAST_CHUNK
from zeroserve.http.limits import DISCARD_MAX_BYTES

STEPS = [None, 1, 7]
NEXT = b"GET /next HTTP/1.1\r\nHost: a\r\n\r\n"


def request(
    version: str = "1.1", connection: bytes | None = None, method: str = "GET", extra: bytes = b""
) -> bytes:
    host = b"Host: a\r\n" if version == "1.1" else b""
    conn = b"Connection: " + connection + b"\r\n" if connection is not None else b""
    return f"{method} / HTTP/{version}\r\n".encode() + host + conn + extra + b"\r\n"


def head_of(conn: HttpConnection, data: bytes, step: int | None = None) -> RequestHead:
    events = pump(conn, data, step=step)
    assert events and isinstance(events[0], RequestHead)
    return events[0]


def header_lines(head: bytes) -> list[bytes]:
    assert head.endswith(b"\r\n\r\n")
    return head[:-4].split(b"\r\n")[1:]


# -- the keep-alive matrix ----------------------------------------------------------------

MATRIX = list(
    itertools.product(["1.0", "1.1"], [b"close", b"keep-alive", None], [False, True], [False, True])
)


@pytest.mark.parametrize(("version", "connection", "draining", "streamed"), MATRIX)
def test_keep_alive_matrix(
    version: str, connection: bytes | None, draining: bool, streamed: bool
) -> None:
    conn = HttpConnection()
    head_of(conn, request(version, connection) + NEXT)
    allowed = connection != b"close" if version == "1.1" else connection == b"keep-alive"
    # A streamed body on HTTP/1.0 has no length and no chunks: closing ends it.
    expected = allowed and not draining and not (streamed and version == "1.0")
    out = conn.start_response(
        200, [(b"x-a", b"1")], content_length=None if streamed else 3, draining=draining
    )
    lines = header_lines(out)
    assert out.startswith(b"HTTP/1.1 200 OK\r\n")
    assert (b"connection: close" in lines) is (not expected)
    assert (b"content-length: 3" in lines) is (not streamed)
    assert (b"transfer-encoding: chunked" in lines) is (streamed and version == "1.1")
    assert conn.chunked_out is (streamed and version == "1.1")
    nxt = conn.end_response(draining=draining)
    if expected:
        assert conn.state is State.HANDLING and nxt is not None and nxt.path == "/next"
    else:
        assert conn.state is State.CLOSED and nxt is None
        assert pump(conn, NEXT) == []  # nothing is parsed after the close


def test_drain_that_starts_mid_response_closes_after_it() -> None:
    conn = HttpConnection()
    head_of(conn, request())
    out = conn.start_response(200, [], content_length=None, draining=False)
    assert b"connection: close" not in header_lines(out)
    assert conn.end_response(draining=True) is None
    assert conn.state is State.CLOSED


def test_client_eof_closes_after_the_response() -> None:
    conn = HttpConnection()
    head_of(conn, request())
    conn.eof = True
    out = conn.start_response(200, [], content_length=0, draining=False)
    assert b"connection: close" in header_lines(out)
    conn.end_response(draining=False)
    assert conn.state is State.CLOSED


def test_cut_off_response_closes() -> None:
    conn = HttpConnection()
    head_of(conn, request() + NEXT)
    conn.start_response(200, [], content_length=None, draining=False)
    conn.close()  # the stream failed after its head: the body is cut off
    assert conn.end_response(draining=False) is None
    assert conn.state is State.CLOSED


def test_keep_alive_serves_the_pipelined_request_next() -> None:
    conn = HttpConnection()
    events = pump(conn, request() + NEXT + NEXT, step=5)
    assert len(events) == 1  # the pipelined heads wait for the answer
    for _ in range(2):
        conn.start_response(204, [], content_length=0, draining=False)
        nxt = conn.end_response(draining=False)
        assert nxt is not None and nxt.path == "/next"
    conn.start_response(204, [], content_length=0, draining=False)
    assert conn.end_response(draining=False) is None and conn.idle


# -- HEAD -----------------------------------------------------------------------------------


@pytest.mark.parametrize("streamed", [False, True])
def test_head_gets_the_head_only(streamed: bool) -> None:
    conn = HttpConnection()
    head_of(conn, request(method="HEAD") + NEXT)
    out = conn.start_response(200, [], content_length=None if streamed else 11, draining=False)
    assert not conn.body_allowed
    # The head is the one a GET would get: the length of the body not sent.
    assert (b"content-length: 11" in header_lines(out)) is (not streamed)
    nxt = conn.end_response(draining=False)
    assert nxt is not None and nxt.method == "GET"


def test_get_after_head_sends_its_body() -> None:
    conn = HttpConnection()
    head_of(conn, request(method="HEAD") + request())
    conn.start_response(200, [], content_length=1, draining=False)
    conn.end_response(draining=False)
    conn.start_response(200, [], content_length=1, draining=False)
    assert conn.body_allowed


# -- 100-continue ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("version", "expect", "line"),
    [("1.1", True, CONTINUE), ("1.1", False, None), ("1.0", True, None)],
)
def test_continue_line(version: str, expect: bool, line: bytes | None) -> None:
    conn = HttpConnection()
    extra = b"Content-Length: 3\r\n" + (b"Expect: 100-continue\r\n" if expect else b"")
    head_of(conn, request(version, method="POST", extra=extra))
    assert conn.continue_line() == line
    assert conn.continue_line() is None  # once
    done = conn.receive_into(memoryview(bytearray(3)))
    assert done is None
    (ev,) = pump(conn, b"abc")
    assert ev.size == 3  # type: ignore[union-attr]


# -- early answers and the discard state -----------------------------------------------------


@pytest.mark.parametrize("step", STEPS, ids=["whole", "bytewise", "step7"])
@pytest.mark.parametrize("sent_with_head", [0, 2, 5])
def test_early_answer_discards_a_small_body(step: int | None, sent_with_head: int) -> None:
    conn = HttpConnection()
    body = b"hello"
    data = request(method="POST", extra=b"Content-Length: 5\r\n")
    head_of(conn, data + body[:sent_with_head], step=step)
    assert conn.state is State.AWAIT_BODY
    out = conn.start_response(404, [], content_length=2, draining=False)
    assert b"connection: close" not in header_lines(out)
    assert conn.end_response(draining=False) is None
    assert conn.state is (State.DISCARD if sent_with_head < len(body) else State.HEAD)
    (nxt,) = pump(conn, body[sent_with_head:] + NEXT, step=step)
    assert isinstance(nxt, RequestHead) and nxt.path == "/next"  # the dropped body is not parsed


@pytest.mark.parametrize(
    ("extra", "status"),
    [
        (b"Content-Length: %d\r\n" % (DISCARD_MAX_BYTES + 1), 404),  # too large to read
        (b"Transfer-Encoding: chunked\r\n", 404),  # length unknown
        (b"Content-Length: 5\r\nExpect: 100-continue\r\n", 404),  # the client holds it back
        (b"Content-Length: 5\r\n", 413),  # refused for its size
    ],
)
def test_early_answer_closes_when_the_body_cannot_be_skipped(extra: bytes, status: int) -> None:
    conn = HttpConnection()
    head_of(conn, request(method="POST", extra=extra))
    out = conn.start_response(status, [], content_length=0, draining=False)
    assert b"connection: close" in header_lines(out)
    assert conn.end_response(draining=False) is None
    assert conn.state is State.CLOSED


def test_early_answer_while_draining_closes() -> None:
    conn = HttpConnection()
    head_of(conn, request(method="POST", extra=b"Content-Length: 5\r\n"))
    out = conn.start_response(429, [], content_length=0, draining=True)
    assert b"connection: close" in header_lines(out)
    conn.end_response(draining=True)
    assert conn.state is State.CLOSED


def test_reject_closes() -> None:
    conn = HttpConnection()
    out = conn.reject(400, [(b"content-type", b"application/json")], 2)
    assert out.startswith(b"HTTP/1.1 400 Bad Request\r\n")
    assert b"connection: close" in header_lines(out) and b"content-length: 2" in header_lines(out)
    assert conn.state is State.CLOSED


# -- the stream framer -----------------------------------------------------------------------


def test_chunked_stream_framing() -> None:
    f = StreamFramer()
    f.begin(b"HEAD", chunked=True, sse=False)
    f.add([b"ab", "c", [b"d", "e"], b""])
    assert f.pieces == 5 and f.size == 5
    assert b"".join(f.flush()) == b"HEAD5\r\nabcde\r\n"
    assert not f.pending
    assert b"".join(f.flush(last=True)) == LAST_CHUNK


def test_close_delimited_stream_framing() -> None:
    f = StreamFramer()
    f.begin(b"HEAD", chunked=False, sse=True)
    f.add([b"x"])
    assert b"".join(f.flush()) == b"HEADdata: x\n\n"
    assert f.flush(last=True) == []  # no last chunk: closing the connection ends it


def test_sse_events_keep_their_framing() -> None:
    f = StreamFramer()
    f.begin(b"", chunked=False, sse=True)
    f.add([b"one", b"two\nlines", memoryview(b"three")])
    assert b"".join(f.flush()) == b"data: one\n\ndata: two\ndata: lines\n\ndata: three\n\n"


def test_many_small_pieces_are_gathered_into_one_counted_copy() -> None:
    before = metrics.copied_bytes("stream_gather")
    f = StreamFramer()
    f.begin(b"H", chunked=True, sse=True)
    pieces = [b"tok%d" % i for i in range(GATHER_MIN_BUFFERS + 1)]
    f.add(pieces)
    buffers = f.flush()
    assert len(buffers) == 4  # head, size line, one gathered buffer, CRLF
    framed = b"".join(b"data: " + p + b"\n\n" for p in pieces)
    assert b"".join(buffers) == b"H%x\r\n" % len(framed) + framed + b"\r\n"
    assert metrics.copied_bytes("stream_gather") - before == sum(map(len, pieces))


def test_payload_sized_pieces_are_not_gathered() -> None:
    before = metrics.copied_bytes("stream_gather")
    f = StreamFramer()
    f.begin(b"H", chunked=True, sse=False)
    big = [bytes(GATHER_MAX_BYTES * 2)] * (GATHER_MIN_BUFFERS + 1)
    f.add(big)
    buffers = f.flush()
    assert len(buffers) == len(big) + 3
    assert all(b is p for b, p in zip(buffers[2:-1], big, strict=True))  # the pieces themselves
    assert metrics.copied_bytes("stream_gather") == before
