"""The echo handler answers from the very buffer the body was received into."""

from __future__ import annotations

import asyncio
import os
from typing import Any

import numpy as np
import pytest
import uvloop

from zeroserve import metrics
from zeroserve.app import App
from zeroserve.models.echo import EchoModel
from zeroserve.runtime import Arena, Engine, ModelConfig
from zeroserve.server.options import ServerOptions
from zeroserve.server.server import Server


class RecordingApp(App):
    """The real App; it only records what each request and its response held."""

    def __init__(self, engine: Any) -> None:
        super().__init__(engine)
        self.seen: list[tuple[int, int, int]] = []  # (body address, body size, response address)

    def handle(self, req: Any) -> Any:
        result = super().handle(req)

        async def record() -> Any:
            resp = await result if asyncio.iscoroutine(result) else result
            body_addr = np.frombuffer(req.body, dtype=np.uint8).ctypes.data
            out_addr = np.frombuffer(resp.body[0], dtype=np.uint8).ctypes.data
            self.seen.append((body_addr, len(req.body), out_addr))
            return resp

        return record()


async def scenario() -> tuple[RecordingApp, Arena, list[bytes], list[bytes], int]:
    arena = Arena(1 << 26)
    engine = Engine({"echo": ModelConfig(name="echo", factory=EchoModel)}, arena=arena)
    await engine.start()
    app = RecordingApp(engine)
    server = Server(app, arena, ServerOptions(port=0))
    await server.start()
    bodies = [os.urandom(n) for n in (1, 4096, 1 << 20, 3 << 20)]
    replies = []
    copied_before = metrics.copied_bytes()
    reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
    for body in bodies:
        writer.write(
            b"POST /v1/raw/echo HTTP/1.1\r\nHost: t\r\nExpect: 100-continue\r\n"
            b"Content-Length: %d\r\n\r\n" % len(body)
        )
        assert await reader.readuntil(b"\r\n\r\n") == b"HTTP/1.1 100 Continue\r\n\r\n"
        writer.write(body)
        head = await reader.readuntil(b"\r\n\r\n")
        length = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
        replies.append(await reader.readexactly(length))
    copied = metrics.copied_bytes() - copied_before
    writer.close()
    await server.shutdown()
    await engine.aclose()
    return app, arena, bodies, replies, copied


@pytest.mark.parametrize("loop", ["uvloop", "asyncio"])
def test_echo_returns_the_receive_buffer(loop: str) -> None:
    runner = uvloop.run if loop == "uvloop" else asyncio.run
    app, arena, bodies, replies, copied = runner(scenario())
    assert replies == bodies
    assert copied == 0
    base = np.frombuffer(arena.view, dtype=np.uint8).ctypes.data
    for (body_addr, size, out_addr), body in zip(app.seen, bodies, strict=True):
        assert size == len(body)
        assert out_addr == body_addr  # the response is the request's own memory
        assert base <= body_addr < base + arena.size  # which is an arena lease
    assert arena.statistics().leases == 0  # every lease came back after sending
    arena.close()
