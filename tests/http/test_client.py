"""The client role of ``http/`` (the gateway's side towards its upstreams), driven by
bytes: the response reader fed whole, one byte at a time, at any split and with trailing
bytes, and its chunked decoding run against the server role's own table."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.http.tables import INVALID_CHUNKED, VALID_CHUNKED
from zeroserve.errors import ProtocolError
from zeroserve.http.client import (
    MAX_HEAD_BYTES,
    Framing,
    ResponseReader,
    request_head,
    response_headers,
)

CHUNKED = (
    b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\nTransfer-Encoding: chunked\r\n"
    b"connection: keep-alive, x-hop\r\nx-hop: 1\r\nx-end: 2\r\n\r\n"
    b"5;ext=1\r\nhello\r\n1\r\n \r\nA\r\n0123456789\r\n0\r\nx-trailer: t\r\n\r\n"
)
LENGTH = b"HTTP/1.1 201 Created\r\ncontent-length: 11\r\nDate: x\r\n\r\nhello world"
CLOSE = b"HTTP/1.0 200 OK\r\ncontent-type: text/plain\r\n\r\nuntil the end"
CHUNKED_HEAD = b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n"
STEPS = [None, 1, 7]


def feed_split(raw: bytes, cuts: list[int], method: str = "POST") -> tuple[ResponseReader, bytes]:
    r = ResponseReader()
    r.start(method)
    body = []
    prev = 0
    for cut in [*sorted(set(cuts)), len(raw)]:
        if cut <= prev:
            continue
        for v in r.feed(raw[prev:cut]):
            assert isinstance(v, memoryview)
            body.append(bytes(v))
        prev = cut
    return r, b"".join(body)


def steps(raw: bytes, step: int | None) -> list[int]:
    return [] if step is None else list(range(step, len(raw), step))


@pytest.mark.parametrize(
    ("raw", "body", "framing", "keep_alive"),
    [
        (CHUNKED, b"hello 0123456789", Framing.CHUNKED, True),
        (LENGTH, b"hello world", Framing.LENGTH, True),
        (CLOSE, b"until the end", Framing.CLOSE, False),
    ],
)
def test_whole_then_bytewise(raw: bytes, body: bytes, framing: Framing, keep_alive: bool) -> None:
    for cuts in ([], list(range(len(raw)))):
        r, got = feed_split(raw, cuts)
        assert got == body
        assert r.head is not None and r.head.framing is framing
        assert r.head.keep_alive is keep_alive
        if framing is Framing.CLOSE:
            assert not r.done and r.feed_eof() and r.done
        else:
            assert r.done


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(0, len(CHUNKED)), max_size=12))
def test_any_split_gives_the_same_body(cuts: list[int]) -> None:
    _, got = feed_split(CHUNKED, cuts)
    assert got == b"hello 0123456789"


def test_body_views_share_the_received_bytes() -> None:
    r = ResponseReader()
    r.start("POST")
    data = LENGTH
    (view,) = r.feed(data)
    assert view.obj is data  # a slice of what the transport handed over: no copy
    r.start("POST")
    data = CHUNKED_HEAD + b"5\r\nhello\r\n0\r\n\r\n"
    (view,) = r.feed(data)
    assert view.obj is data and bytes(view) == b"hello"


def test_trailing_bytes_after_the_response_are_an_error() -> None:
    r = ResponseReader()
    r.start("POST")
    with pytest.raises(ProtocolError):
        r.feed(LENGTH + b"HTTP/1.1 200 OK\r\n")


def test_no_body_statuses_and_head_and_informational() -> None:
    for raw, method in (
        (b"HTTP/1.1 204 No Content\r\n\r\n", "POST"),
        (b"HTTP/1.1 304 Not Modified\r\ncontent-length: 5\r\n\r\n", "GET"),
        (b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\n\r\n", "HEAD"),
        (b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n", "POST"),
    ):
        r, body = feed_split(raw, [], method)
        assert body == b"" and r.done
    r, body = feed_split(b"HTTP/1.1 103 Early Hints\r\nlink: x\r\n\r\n" + LENGTH, [5, 40])
    assert r.head is not None and r.head.status == 201 and body == b"hello world"


@pytest.mark.parametrize(
    "raw",
    [
        b"HTTP/1.1 200 OK\r\ncontent-length: 1\r\ncontent-length: 2\r\n\r\n",
        b"HTTP/1.1 200 OK\r\ncontent-length: -1\r\n\r\n",
        b"NOT HTTP AT ALL\r\n\r\n",
    ],
)
def test_malformed_heads_raise_protocol_error(raw: bytes) -> None:
    r = ResponseReader()
    r.start("POST")
    with pytest.raises(ProtocolError):
        r.feed(raw)


def test_head_size_is_bounded() -> None:
    r = ResponseReader()
    r.start("POST")
    with pytest.raises(ProtocolError):
        r.feed(b"HTTP/1.1 200 OK\r\n" + b"x: y\r\n" * (MAX_HEAD_BYTES // 6 + 1))


# -- chunked: the server role's table --------------------------------------------------------


@pytest.mark.parametrize("step", STEPS, ids=["whole", "bytewise", "step7"])
@pytest.mark.parametrize(
    ("name", "body", "decoded"), VALID_CHUNKED, ids=[c[0] for c in VALID_CHUNKED]
)
def test_valid_chunked(name: str, body: bytes, decoded: bytes, step: int | None) -> None:
    raw = CHUNKED_HEAD + body
    r, got = feed_split(raw, steps(raw, step))
    assert got == decoded and r.done


CLIENT_INVALID = [c for c in INVALID_CHUNKED if c[2] != 413]  # the server's body limit


@pytest.mark.parametrize("step", STEPS, ids=["whole", "bytewise", "step7"])
@pytest.mark.parametrize(
    ("name", "body", "status"), CLIENT_INVALID, ids=[c[0] for c in CLIENT_INVALID]
)
def test_invalid_chunked(name: str, body: bytes, status: int, step: int | None) -> None:
    raw = CHUNKED_HEAD + body
    with pytest.raises(ProtocolError) as info:
        feed_split(raw, steps(raw, step))
    assert info.value.status == status  # the same error as the server role's


@pytest.mark.parametrize(
    ("name", "body", "status"), CLIENT_INVALID, ids=[c[0] for c in CLIENT_INVALID]
)
def test_invalid_chunked_with_trailing_bytes(name: str, body: bytes, status: int) -> None:
    with pytest.raises(ProtocolError) as info:
        feed_split(CHUNKED_HEAD + body + LENGTH * 3, [])
    assert info.value.status == status


# -- an intermediary's header filtering ------------------------------------------------------


def test_hop_by_hop_headers_are_not_relayed() -> None:
    r, _ = feed_split(CHUNKED, [])
    assert r.head is not None
    headers, ctype = response_headers(r.head)
    assert ctype == b"text/event-stream"
    assert headers == [(b"x-end", b"2")]  # connection, x-hop (named by it), t-e dropped
    r, _ = feed_split(LENGTH, [])
    assert r.head is not None
    assert response_headers(r.head) == ([], None)  # content-length and date are ours


def test_request_head_filters_client_headers() -> None:
    head = request_head(
        "POST",
        "/v1/chat/completions?x=1",
        "up:8000",
        42,
        [
            (b"host", b"gw"),
            (b"content-length", b"7"),
            (b"connection", b"close"),
            (b"authorization", b"Bearer client"),
            (b"accept", b"text/event-stream"),
            (b"transfer-encoding", b"chunked"),
        ],
        [(b"authorization", b"Bearer upstream")],
    )
    assert head == (
        b"POST /v1/chat/completions?x=1 HTTP/1.1\r\nhost: up:8000\r\ncontent-length: 42\r\n"
        b"accept: text/event-stream\r\nauthorization: Bearer upstream\r\n\r\n"
    )
