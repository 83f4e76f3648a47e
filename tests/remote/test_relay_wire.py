"""The relay's sans-I/O parts, driven by bytes: the response reader (whole, one byte at
a time, any split, trailing bytes) and the ``"model"`` rewriter."""

from __future__ import annotations

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from zeroserve.app.relay._rewrite import model_spans, rewrite_model
from zeroserve.app.relay._wire import (
    MAX_HEAD_BYTES,
    Framing,
    ResponseReader,
    WireError,
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


def test_trailing_bytes_after_the_response_are_an_error() -> None:
    r = ResponseReader()
    r.start("POST")
    with pytest.raises(WireError):
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
        b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\nzz\r\n",
        b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n-5\r\n",
        b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n2\r\nabXY",
        b"HTTP/1.1 200 OK\r\ncontent-length: 1\r\ncontent-length: 2\r\n\r\n",
        b"HTTP/1.1 200 OK\r\ncontent-length: -1\r\n\r\n",
        b"NOT HTTP AT ALL\r\n\r\n",
        b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n" + b"1" * 5000,
    ],
)
def test_malformed_responses_raise_wire_error(raw: bytes) -> None:
    r = ResponseReader()
    r.start("POST")
    with pytest.raises(WireError):
        r.feed(raw)


def test_head_size_is_bounded() -> None:
    r = ResponseReader()
    r.start("POST")
    with pytest.raises(WireError):
        r.feed(b"HTTP/1.1 200 OK\r\n" + b"x: y\r\n" * (MAX_HEAD_BYTES // 6 + 1))


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


# -- the "model" rewriter -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        (b'{"model":"a","x":1}', {"model": "B", "x": 1}),
        (b' { "x" : [1, {"model": "no"}, "]"] , "model" : "a" } ', {"x": [1, {"model": "no"}, "]"], "model": "B"}),
        (b'{"messages":[{"content":"\\"model\\": \\"x\\""}],"model":"a"}', {"messages": [{"content": '"model": "x"'}], "model": "B"}),
        (b'{"mod\\u0065l":"a"}', {"model": "B"}),
        (b'{"model":"a","model":"c"}', {"model": "B"}),
    ],
)
def test_rewrite_model_only(body: bytes, expected: dict[str, object]) -> None:
    out = rewrite_model(memoryview(body), "B")
    assert out is not None
    assert msgspec.json.decode(b"".join(bytes(b) for b in out)) == expected


@pytest.mark.parametrize(
    "body", [b"", b"[]", b'{"x":1}', b'{"model":1}', b'{"model":"a"', b"{bad}", b'{"a":tru'],
)
def test_no_rewrite_when_there_is_nothing_to_rewrite(body: bytes) -> None:
    assert rewrite_model(memoryview(body), "B") is None


def test_rewrite_keeps_the_rest_as_views_of_the_body() -> None:
    prompt = "word " * 20000
    body = msgspec.json.encode({"model": "a", "messages": [{"role": "user", "content": prompt}]})
    out = rewrite_model(memoryview(body), "upstream-name")
    assert out is not None and len(out) == 3
    assert isinstance(out[2], memoryview) and out[2].obj is body
    assert msgspec.json.decode(b"".join(bytes(b) for b in out))["model"] == "upstream-name"


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=20,
)


@settings(max_examples=150, deadline=None)
@given(st.dictionaries(st.text(max_size=8), json_values, max_size=6), st.text(), st.booleans())
def test_rewrite_property(obj: dict[str, object], name: str, with_model: bool) -> None:
    if with_model:
        obj = {**obj, "model": "original"}
    body = msgspec.json.encode(obj)
    spans = model_spans(body)
    assert spans is not None
    out = rewrite_model(memoryview(body), name)
    if isinstance(obj.get("model"), str):
        assert out is not None
        assert msgspec.json.decode(b"".join(bytes(b) for b in out)) == {**obj, "model": name}
    else:
        assert out is None


# -- the remote model's options -------------------------------------------------------------


def test_remote_spec_options_are_checked_at_load() -> None:
    from zeroserve.models.loader import parse_spec
    from zeroserve.models.remote import RemoteModel

    spec = parse_spec("g=remote:http://a:1/v1/,https://b/v1?upstream_model=m&connections=4&timeout=2.5")
    m = RemoteModel(**spec.options)
    assert [u.url for u in m.config.upstreams] == ["http://a:1/v1", "https://b/v1"]
    assert [(u.port, u.base_path, u.authority) for u in m.config.upstreams] == [
        (1, "/v1", "a:1"),
        (443, "/v1", "b"),
    ]
    assert (m.config.upstream_model, m.config.connections, m.config.timeout) == ("m", 4, 2.5)
    assert RemoteModel.capabilities() == frozenset()  # the engine hosts it with none
    for bad in ("", "ftp://x/v1", "http:///v1", "http://h/v1?x=1"):
        with pytest.raises(ValueError):
            RemoteModel(location=bad)
    for opts in ({"connections": 0}, {"timeout": "soon"}, {"colour": "blue"}):
        with pytest.raises(ValueError):
            RemoteModel(location="http://h/v1", **opts)
    with pytest.raises(ValueError, match="ZS_UNSET_KEY"):
        RemoteModel(location="http://h/v1", api_key_env="ZS_UNSET_KEY").load()
