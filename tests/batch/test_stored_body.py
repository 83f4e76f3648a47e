"""A body stored as it arrives (``HttpConnection.receive_streamed``, the path of an
upload written to disk): fed whole, in steps and byte by byte, through windows of any
size, the sink gets exactly the body, and the bytes after it (a pipelined request) are
parsed as the next head, never written to the sink."""

from __future__ import annotations

import pytest

from zeroserve.http import BodyComplete, HttpConnection, RequestHead, State

BODY = bytes(range(256)) * 40 + b"tail"


class Sink:
    def __init__(self) -> None:
        self.data = bytearray()
        self.writes = 0

    def write(self, data: memoryview) -> None:
        self.data += data
        self.writes += 1


def _request(body: bytes) -> bytes:
    return b"POST /v1/files HTTP/1.1\r\nhost: x\r\ncontent-length: %d\r\n\r\n" % len(body) + body


@pytest.mark.parametrize("window", [1, 7, 4096, len(BODY), 10 * len(BODY)])
@pytest.mark.parametrize("step", [None, 1, 13, 1000])
def test_the_sink_gets_the_body_and_the_next_head_is_parsed(window: int, step: int | None) -> None:
    data = _request(BODY) + b"GET /health HTTP/1.1\r\nhost: x\r\n\r\n"
    conn = HttpConnection()
    sink = Sink()
    heads: list[RequestHead] = []
    complete: list[BodyComplete] = []
    view = memoryview(bytearray(window))
    pos = 0

    def on(ev: RequestHead | BodyComplete | None) -> None:
        while ev is not None:
            if isinstance(ev, RequestHead):
                heads.append(ev)
                if ev.content_length:
                    ev = conn.receive_streamed(sink, view)
                    continue
            else:
                complete.append(ev)
            conn.start_response(200, [], content_length=0, draining=False)
            ev = conn.end_response(draining=False)

    while pos < len(data):
        buf = conn.next_buffer()
        assert len(buf) > 0
        if conn.state is State.STREAMED:
            assert len(buf) <= window  # received through the window only
        n = min(len(buf), len(data) - pos, step or len(data))
        buf[:n] = data[pos : pos + n]
        pos += n
        on(conn.buffer_updated(n))
    assert bytes(sink.data) == BODY
    assert complete == [BodyComplete(len(BODY))]
    assert [h.path for h in heads] == ["/v1/files", "/health"]
    if window < len(BODY) and step is not None:
        assert sink.writes > 1  # written as it arrived, not gathered first


def test_a_streamed_receive_needs_a_content_length_body_and_a_window() -> None:
    conn = HttpConnection()
    buf = conn.next_buffer()
    head = _request(b"ab")[:-2]
    buf[: len(head)] = head
    ev = conn.buffer_updated(len(head))
    assert isinstance(ev, RequestHead)
    with pytest.raises(ValueError):
        conn.receive_streamed(Sink(), memoryview(bytearray(0)))
    sink = Sink()
    assert conn.receive_streamed(sink, memoryview(bytearray(1))) is None
    with pytest.raises(RuntimeError):
        conn.receive_streamed(sink, memoryview(bytearray(1)))
