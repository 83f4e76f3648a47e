"""Drive an HttpConnection with bytes, the way the I/O layer does, without sockets."""

from __future__ import annotations

from dataclasses import dataclass, field

from zeroserve.http import BodyComplete, HttpConnection, HttpLimits, RequestHead, State


class ByteSink:
    def __init__(self) -> None:
        self.data = bytearray()

    def write(self, data: memoryview) -> None:
        self.data += data


@dataclass
class Parsed:
    head: RequestHead
    body: bytes


@dataclass
class Outcome:
    requests: list[Parsed] = field(default_factory=list)
    leftover: int = 0


def feed(data: bytes, *, step: int | None = None, limits: HttpLimits | None = None) -> Outcome:
    """Feed ``data`` in reads of at most ``step`` bytes (None: as much as the buffer takes);
    complete each request (answering it at once) and return what was parsed."""
    conn = HttpConnection(limits)
    out = Outcome()
    pos = 0
    body: bytearray | ByteSink | None = None
    head: RequestHead | None = None

    def on_event(ev: RequestHead | BodyComplete | None) -> None:
        nonlocal body, head
        while ev is not None:
            if isinstance(ev, RequestHead):
                head = ev
                if ev.chunked:
                    body = ByteSink()
                    ev = conn.receive_chunked(body)
                    continue
                if ev.content_length:
                    body = bytearray(ev.content_length)
                    ev = conn.receive_into(memoryview(body))
                    continue
                body = None
            assert head is not None
            data_ = body.data if isinstance(body, ByteSink) else body
            out.requests.append(Parsed(head, bytes(data_ or b"")))
            conn.start_response(200, [], content_length=0, draining=False)
            ev = conn.end_response(draining=False)
            if conn.state is State.CLOSED:
                return

    while pos < len(data) and conn.state.value != "closed":
        buf = conn.next_buffer()
        assert len(buf) > 0, "the connection offered no buffer while input remains"
        n = min(len(buf), len(data) - pos)
        if step is not None:
            n = min(n, step)
        buf[:n] = data[pos : pos + n]
        pos += n
        on_event(conn.buffer_updated(n))
    out.leftover = conn.buffered
    return out


def pump(
    conn: HttpConnection, data: bytes, *, step: int | None = None
) -> list[RequestHead | BodyComplete]:
    """Feed ``data`` to ``conn`` in reads of at most ``step`` bytes, without answering;
    return the events in order. The caller drives the response side."""
    events: list[RequestHead | BodyComplete] = []
    pos = 0
    while pos < len(data) and conn.state is not State.CLOSED:
        buf = conn.next_buffer()
        assert len(buf) > 0, "the connection offered no buffer while input remains"
        n = min(len(buf), len(data) - pos)
        if step is not None:
            n = min(n, step)
        buf[:n] = data[pos : pos + n]
        pos += n
        ev = conn.buffer_updated(n)
        if ev is not None:
            events.append(ev)
    return events
