"""A blocking raw-socket HTTP/1.1 client for protocol tests. Responses are parsed by h11
(an independent implementation), so our framing is checked by someone else's parser."""

from __future__ import annotations

import socket
import time
from dataclasses import dataclass, field

import h11

from tests.support import scaled

IO_TIMEOUT_S = scaled(10.0)


@dataclass
class RawResponse:
    status: int
    headers: dict[str, str]
    body: bytes = b""
    chunks: list[bytes] = field(default_factory=list)


class RawClient:
    def __init__(self, host: str, port: int, timeout: float = IO_TIMEOUT_S) -> None:
        self.sock = socket.create_connection((host, port), timeout=timeout)
        self.conn = h11.Connection(h11.CLIENT)

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def close(self) -> None:
        self.sock.close()

    def read_response(self) -> RawResponse:
        """Read one response (skipping 1xx) with h11; raises on malformed framing."""
        resp: RawResponse | None = None
        while True:
            event = self.conn.next_event()
            if event is h11.NEED_DATA:
                data = self.sock.recv(1 << 16)
                self.conn.receive_data(data)
                continue
            if isinstance(event, h11.InformationalResponse):
                continue
            if isinstance(event, h11.Response):
                resp = RawResponse(
                    event.status_code, {k.decode(): v.decode() for k, v in event.headers}
                )
            elif isinstance(event, h11.Data):
                assert resp is not None
                resp.chunks.append(bytes(event.data))
            elif isinstance(event, h11.EndOfMessage):
                assert resp is not None
                resp.body = b"".join(resp.chunks)
                if self.conn.our_state is h11.DONE and self.conn.their_state is h11.DONE:
                    self.conn.start_next_cycle()
                return resp
            elif isinstance(event, h11.ConnectionClosed):
                raise ConnectionError("closed before a complete response")

    def request(self, data: bytes) -> RawResponse:
        """Send a raw request and read its response. h11 must be told a request went out."""
        self._note_request(data)
        self.send(data)
        return self.read_response()

    def _note_request(self, data: bytes) -> None:
        # h11 tracks the client side too; feed it a matching request event so it parses
        # the response in the right state (HEAD vs other).
        method = data.split(b" ", 1)[0]
        target = data.split(b" ", 2)[1]
        self.conn.send(h11.Request(method=method, target=target, headers=[("Host", "t")]))
        self.conn.send(h11.EndOfMessage())

    def wait_closed(self, timeout: float = IO_TIMEOUT_S) -> bytes:
        """Read until the server closes the connection (bounded); returns what was read."""
        deadline = time.monotonic() + timeout
        got = bytearray()
        while time.monotonic() < deadline:
            self.sock.settimeout(max(0.01, deadline - time.monotonic()))
            try:
                data = self.sock.recv(1 << 16)
            except ConnectionResetError:
                return bytes(got)
            except TimeoutError:
                break
            if not data:
                return bytes(got)
            got += data
        raise TimeoutError("server did not close the connection")


def read_status(raw: bytes) -> int:
    return int(raw.split(b" ", 2)[1])
