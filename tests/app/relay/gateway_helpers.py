"""Loopback servers for the gateway suite: in-process zeroserve instances (an ``echo``
upstream, a gateway of ``remote:`` models) and purpose-built upstreams that misbehave on
cue. Everything listens on 127.0.0.1 with a port of 0; nothing sleeps."""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from tests.support import scaled
from zeroserve.app import App
from zeroserve.app.backends.remote import RemoteBackend
from zeroserve.app.relay import Relay
from zeroserve.models.echo import EchoModel
from zeroserve.models.loader import parse_spec
from zeroserve.runtime import Arena, Engine, ModelConfig
from zeroserve.server.options import ServerOptions
from zeroserve.server.server import Server

ARENA_BYTES = 256 << 20


@dataclass
class Running:
    server: Server
    engine: Engine
    app: App
    arena: Arena

    @property
    def port(self) -> int:
        return self.server.port

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def relay(self, name: str = "g") -> Relay:
        backend = self.app.backends.get(name)
        assert isinstance(backend, RemoteBackend)
        return backend.relay


@contextlib.asynccontextmanager
async def zeroserve(configs: dict[str, ModelConfig]) -> AsyncIterator[Running]:
    """A real zeroserve (engine, app, server) on a free loopback port, in this loop."""
    arena = Arena(ARENA_BYTES, warm_bytes=1 << 20)
    engine = Engine(configs, arena=arena)
    await engine.start()
    app = App(engine)
    server = Server(
        app, arena, ServerOptions(host="127.0.0.1", port=0, graceful_timeout=scaled(2.0))
    )
    await server.start()
    try:
        yield Running(server, engine, app, arena)
    finally:
        await server.shutdown()
        await app.aclose()
        await engine.aclose()
        stats = arena.statistics()
        arena.close()
        assert stats.leases == 0, f"leaked leases: {stats}"


def echo_upstream() -> contextlib.AbstractAsyncContextManager[Running]:
    return zeroserve({"echo": ModelConfig(name="echo", factory=EchoModel)})


def gateway(*specs: str) -> contextlib.AbstractAsyncContextManager[Running]:
    """A gateway serving ``NAME=remote:URL?options`` specs, parsed as ``--model`` is."""
    configs = {}
    for text in specs:
        spec = parse_spec(text)
        configs[spec.name] = ModelConfig(
            name=spec.name, factory=spec.load_class(), options=spec.options, **spec.runtime
        )
    return zeroserve(configs)


def closed_port() -> int:
    """A loopback port nobody listens on (connections are refused)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def assert_no_leaks(relay: Relay) -> None:
    """Every exchange is over and every open connection is idle in the pool."""
    for url, st in relay.statistics().upstreams.items():
        assert st.in_flight == 0, (url, st)
        assert st.connections == st.idle, (url, st)
        assert st.pending_bytes == 0, (url, st)


# -- misbehaving upstreams ---------------------------------------------------------------------


@dataclass
class Request:
    head: bytes
    body: bytes
    number: int  # on its connection, from 1

    def header(self, name: bytes) -> bytes | None:
        for line in self.head.split(b"\r\n")[1:]:
            k, _, v = line.partition(b":")
            if k.strip().lower() == name:
                return v.strip()
        return None


Behaviour = Callable[["Fake", Request, asyncio.StreamReader, asyncio.StreamWriter], Awaitable[bool]]


@dataclass
class Fake:
    """An HTTP/1.1 upstream whose answers are scripted by ``behaviour`` (it returns
    whether the connection stays open for another request). Events let tests wait for
    what the upstream saw instead of sleeping."""

    behaviour: Behaviour
    requests: list[Request] = field(default_factory=list)
    request_seen: asyncio.Event = field(default_factory=asyncio.Event)
    peer_closed: asyncio.Event = field(default_factory=asyncio.Event)
    blocked: asyncio.Event = field(default_factory=asyncio.Event)  # our writes back up
    release: asyncio.Event = field(default_factory=asyncio.Event)  # tests let it go on
    connections: int = 0
    open_connections: int = 0
    bytes_sent: int = 0
    port: int = 0
    _server: asyncio.base_events.Server | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    async def __aenter__(self) -> Fake:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._server is not None
        self.release.set()
        self._server.close()
        for w in list(self._writers):
            w.transport.abort()
        await self._server.wait_closed()

    _writers: set[asyncio.StreamWriter] = field(default_factory=set)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        self.open_connections += 1
        self._writers.add(writer)
        number = 0
        try:
            while True:
                try:
                    head = await reader.readuntil(b"\r\n\r\n")
                except (asyncio.IncompleteReadError, ConnectionError):
                    self.peer_closed.set()
                    return
                number += 1
                req = Request(head, b"", number)
                length = req.header(b"content-length")
                if length:
                    req.body = await reader.readexactly(int(length))
                self.requests.append(req)
                self.request_seen.set()
                if not await self.behaviour(self, req, reader, writer):
                    return
        except (ConnectionError, asyncio.IncompleteReadError):
            self.peer_closed.set()
        finally:
            self.open_connections -= 1
            self._writers.discard(writer)
            writer.transport.abort()

    async def wait_peer_closed(self, reader: asyncio.StreamReader) -> None:
        """Block until the gateway closes this connection (EOF or reset)."""
        try:
            while await reader.read(65536):
                pass
        except ConnectionError:
            pass
        self.peer_closed.set()

    async def send(self, writer: asyncio.StreamWriter, data: bytes) -> None:
        writer.write(data)
        self.bytes_sent += len(data)
        if writer.transport.get_write_buffer_size() > 0:
            self.blocked.set()
        await writer.drain()


def response(
    status: int, body: bytes, content_type: bytes = b"application/json", extra: bytes = b""
) -> bytes:
    return (
        b"HTTP/1.1 %d X\r\ncontent-type: %s\r\ncontent-length: %d\r\n%s\r\n"
        % (status, content_type, len(body), extra)
        + body
    )


def chunked_head(status: int = 200, content_type: bytes = b"text/event-stream") -> bytes:
    return b"HTTP/1.1 %d OK\r\ncontent-type: %s\r\ntransfer-encoding: chunked\r\n\r\n" % (
        status,
        content_type,
    )


def chunk(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


async def answer_ok(fake: Fake, req: Request, r: Any, w: asyncio.StreamWriter) -> bool:
    await fake.send(w, response(200, b'{"ok":true}'))
    return True


def answer_status(status: int, body: bytes = b'{"error":{"message":"nope"}}') -> Behaviour:
    async def go(fake: Fake, req: Request, r: Any, w: asyncio.StreamWriter) -> bool:
        await fake.send(w, response(status, body))
        return True

    return go


async def never_answer(fake: Fake, req: Request, r: asyncio.StreamReader, w: Any) -> bool:
    await fake.wait_peer_closed(r)
    return False


async def stall_after_first_chunk(
    fake: Fake, req: Request, r: asyncio.StreamReader, w: asyncio.StreamWriter
) -> bool:
    await fake.send(w, chunked_head() + chunk(b"data: first\n\n"))
    await fake.wait_peer_closed(r)
    return False


async def reset_mid_stream(
    fake: Fake, req: Request, r: asyncio.StreamReader, w: asyncio.StreamWriter
) -> bool:
    """The first connection is reset mid-stream; later ones are answered."""
    if fake.connections > 1:
        return await answer_ok(fake, req, r, w)
    await fake.send(w, chunked_head() + chunk(b"data: one\n\n") + chunk(b"data: two\n\n"))
    sock = w.get_extra_info("socket")
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
    w.transport.abort()  # RST
    return False


def pattern(n: int, seed: int = 0) -> bytes:
    """``n`` deterministic, non-repeating-looking bytes."""
    block = bytes((i * 131 + seed * 7 + (i >> 8)) & 0xFF for i in range(65536))
    return (block * (n // len(block) + 1))[:n]
