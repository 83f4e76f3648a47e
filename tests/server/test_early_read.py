"""A new connection's first bytes (docs/decisions/0015-early-reads-of-a-new-connection.md):
what a client sent with its connect is read in ``connection_made``, before the loop reads
for the connection. Each test writes its bytes into a real TCP connection before the server
side of it is handed to the loop (``connect_accepted_socket``), so they
are in the socket when ``connection_made`` runs and that path always takes them."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Awaitable, Callable

import pytest
import uvloop

from tests.server.inproc import serving
from tests.support import scaled
from tests.support.models.raw import Endless
from zeroserve.models.echo import EchoModel
from zeroserve.server.connection import HttpProtocol
from zeroserve.server.options import ServerOptions

IO_TIMEOUT_S = scaled(10.0)
HEALTH = b"GET /health HTTP/1.1\r\nHost: t\r\n\r\n"


def _echo_request(body: bytes, extra: bytes = b"") -> bytes:
    return (
        b"POST /v1/raw/echo HTTP/1.1\r\nHost: t\r\nContent-Type: application/octet-stream\r\n"
        + extra
        + b"Content-Length: %d\r\n\r\n" % len(body)
        + body
    )


HandOver = Callable[[], Awaitable[None]]
Scenario = Callable[[socket.socket, HandOver], Awaitable[bytes]]


def _run(scenario: Scenario, loop_name: str) -> bytes:
    """Serve ``echo`` and ``endless`` in-process on ``loop_name`` (uvloop or asyncio, whose
    transports both call ``connection_made`` before they read); ``scenario`` gets a
    connected client socket and a function that hands that connection's server side to
    the loop."""

    async def main() -> bytes:
        loop = asyncio.get_running_loop()
        models = {"echo": EchoModel, "endless": Endless}
        async with serving(models, ServerOptions(port=0)) as server:
            listener = socket.create_server(("127.0.0.1", 0))
            client = socket.create_connection(listener.getsockname(), timeout=IO_TIMEOUT_S)
            accepted, _ = listener.accept()
            listener.close()
            accepted.setblocking(False)

            async def hand_over() -> None:
                await loop.connect_accepted_socket(lambda: HttpProtocol(server), accepted)

            try:
                return await scenario(client, hand_over)
            finally:
                client.close()

    return uvloop.run(main()) if loop_name == "uvloop" else asyncio.run(main())


async def _read_until(sock: socket.socket, done: Callable[[bytes], bool]) -> bytes:
    """What the client receives until ``done`` says so (a blocking read on a thread, so
    the loop keeps serving; bounded by the socket's timeout)."""
    seen = b""
    while not done(seen):
        chunk = await asyncio.to_thread(sock.recv, 1 << 20)
        if not chunk:
            break
        seen += chunk
    return seen


@pytest.mark.parametrize("size", [100, 48 * 1024], ids=["small", "48KiB"])
def test_a_request_sent_with_the_connect_is_answered(loop_name: str, size: int) -> None:
    """A small request is taken whole by the first read; a 48 KiB body (past the head
    buffer's first window, 1 KiB) by the reads after it, into the body's lease."""
    body = bytes(range(256)) * (size // 256) + b"z" * (size % 256)

    async def scenario(client: socket.socket, hand_over: HandOver) -> bytes:
        client.sendall(_echo_request(body))
        await hand_over()
        return await _read_until(client, lambda seen: seen.endswith(body))

    seen = _run(scenario, loop_name)
    assert seen.startswith(b"HTTP/1.1 200 ") and seen.endswith(body)


def test_a_head_larger_than_the_first_window_is_read_whole(loop_name: str) -> None:
    """A head of ~6 KiB: the head buffer's window doubles from 1 KiB across the reads."""
    extra = b"".join(b"X-Pad-%d: %s\r\n" % (i, b"p" * 90) for i in range(60))

    async def scenario(client: socket.socket, hand_over: HandOver) -> bytes:
        client.sendall(_echo_request(b"padded", extra))
        await hand_over()
        return await _read_until(client, lambda seen: seen.endswith(b"padded"))

    seen = _run(scenario, loop_name)
    assert seen.startswith(b"HTTP/1.1 200 ")


def test_a_pipelined_burst_larger_than_the_head_buffer_is_answered_in_full(loop_name: str) -> None:
    """More pipelined requests than the head buffer (16 KiB) and the early reads hold:
    the early reads stop short of filling the buffer, the loop reads the rest, and every
    request is answered in order."""
    count = 1500  # 49.5 KB of heads

    async def scenario(client: socket.socket, hand_over: HandOver) -> bytes:
        client.sendall(HEALTH * count)
        await hand_over()
        return await _read_until(client, lambda seen: seen.count(b"HTTP/1.1 200 ") >= count)

    seen = _run(scenario, loop_name)
    assert seen.count(b"HTTP/1.1 200 ") == count


def test_early_reads_never_fill_the_head_buffer(loop_name: str) -> None:
    """A head just under the head buffer's 16 KiB, for a stream (its handler holds the
    connection), with a second request pipelined behind it. The early reads take the
    buffer up to its last byte, no further: full, the connection would ask to pause
    reading, the loop would start reading anyway once ``connection_made`` returns, and
    ask for a buffer with no room. Both requests are answered, in order."""
    pad = b"".join(b"X-Pad-%02d: %s\r\n" % (i, b"p" * 166) for i in range(90))
    stream = (
        b"POST /v1/raw/echo HTTP/1.1\r\nHost: t\r\nAccept: text/event-stream\r\n"
        + pad
        + b"Content-Length: 5\r\n\r\na b c"
    )
    assert 15 * 1024 < len(stream) < 16 * 1024 - 64

    async def scenario(client: socket.socket, hand_over: HandOver) -> bytes:
        client.sendall(stream + HEALTH * 40)
        await hand_over()
        return await _read_until(client, lambda seen: seen.count(b"HTTP/1.1 200 ") >= 41)

    seen = _run(scenario, loop_name)
    assert seen.startswith(b"HTTP/1.1 200 ") and b"data: c" in seen
    assert seen.count(b"HTTP/1.1 200 ") == 41


def test_a_stream_sent_with_the_connect_starts(loop_name: str) -> None:
    async def scenario(client: socket.socket, hand_over: HandOver) -> bytes:
        client.sendall(
            b"POST /v1/raw/endless HTTP/1.1\r\nHost: t\r\nAccept: text/event-stream\r\n"
            b"Content-Length: 3\r\n\r\nnew"
        )
        await hand_over()
        return await _read_until(client, lambda seen: b"data: x" in seen)

    seen = _run(scenario, loop_name)
    assert seen.startswith(b"HTTP/1.1 200 ") and b"data: x" in seen


def test_expect_continue_is_answered_before_the_body_is_sent(loop_name: str) -> None:
    """The head asks for 100 Continue: the early reads stop at the empty socket, the
    client gets its 100, sends the body, and the loop reads it."""
    body = b"after-continue"

    async def scenario(client: socket.socket, hand_over: HandOver) -> bytes:
        request = _echo_request(body, b"Expect: 100-continue\r\n")
        client.sendall(request[: -len(body)])
        await hand_over()
        interim = await _read_until(client, lambda seen: b"\r\n\r\n" in seen)
        assert interim.startswith(b"HTTP/1.1 100 "), interim
        client.sendall(body)
        rest = interim.split(b"\r\n\r\n", 1)[1]
        return rest + await _read_until(client, lambda seen: (rest + seen).endswith(body))

    seen = _run(scenario, loop_name)
    assert seen.startswith(b"HTTP/1.1 200 ") and seen.endswith(body)


def test_a_client_that_closes_after_its_request_is_answered_then_closed(loop_name: str) -> None:
    """Request, then FIN, before the server side is handed over: the early reads take the
    request (``/health`` answers at once) and stop at the EOF, which the transport's own
    read then finds: the server closes the connection (a read past it would time out)."""

    async def scenario(client: socket.socket, hand_over: HandOver) -> bytes:
        client.sendall(HEALTH)
        client.shutdown(socket.SHUT_WR)
        await hand_over()
        return await _read_until(client, lambda seen: False)  # until the server closes

    seen = _run(scenario, loop_name)
    assert seen.startswith(b"HTTP/1.1 200 ") and seen.count(b"HTTP/1.1 ") == 1
