"""The stream writer loop: a streamed body's pieces, framed and written as they arrive.

Strategy
--------
Pieces are framed by ``http.framing.StreamFramer`` as they arrive and flushed once per
loop iteration (``call_soon``), so a burst costs one ``writelines`` while a lone piece
still leaves at once. At most ``STREAM_BATCH_PIECES`` / ``STREAM_BATCH_BYTES`` are
gathered before the writer flushes and yields, so a producer that never awaits cannot
starve other connections; while the transport is paused the writer waits for the drain
(``WriteFlow.drain``): that is the backpressure the producer feels.

The head and its framing come from ``HttpConnection.start_response``; this module only
moves bytes (docs/architecture.md, "server/: asyncio glue").
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

from ..http.framing import StreamFramer
from .flow import WriteFlow
from .options import STREAM_BATCH_BYTES, STREAM_BATCH_PIECES


class StreamWriter:
    """Writes the streamed bodies of one connection, one at a time."""

    __slots__ = ("_flush_scheduled", "flow", "framer", "loop")

    def __init__(self, loop: asyncio.AbstractEventLoop, flow: WriteFlow) -> None:
        self.loop = loop
        self.flow = flow
        self.framer = StreamFramer()
        self._flush_scheduled = False

    async def write(
        self, head: bytes, it: AsyncIterator[Any], first: Any, *, sse: bool, chunked: bool
    ) -> Exception | None:
        """Send ``head``, ``first`` and the rest of ``it``. Returns the exception the
        iterator raised after the head was sent (the caller ends the stream), else None.
        The last chunk is not written: ``flush(last=True)`` ends the body."""
        framer = self.framer
        flow = self.flow
        framer.begin(head, chunked=chunked, sse=sse)
        if first is None:
            return None
        batch = getattr(it, "receive_batch_nowait", None)
        ready = [first]
        if batch is not None:
            ready += batch(STREAM_BATCH_PIECES - 1)
        framer.add(ready)
        self.flush()
        while True:
            try:
                piece = await it.__anext__()
            except StopAsyncIteration:
                return None
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                return exc
            if batch is None:
                framer.add([piece])
            else:
                # Everything else that is ready goes out in the same write.
                ready = [piece]
                ready += batch(STREAM_BATCH_PIECES - 1 - framer.pieces)
                framer.add(ready)
            if not self._flush_scheduled:
                self._flush_scheduled = True
                self.loop.call_soon(self.flush)
            if framer.pieces >= STREAM_BATCH_PIECES or framer.size >= STREAM_BATCH_BYTES:
                self.flush()
                await asyncio.sleep(0)
            if flow.paused:
                self.flush()
                await flow.drain()

    def flush(self, last: bool = False) -> None:
        """Write what is pending (and the last chunk if ``last``)."""
        self._flush_scheduled = False
        transport = self.flow.transport
        if transport is None or self.flow.closed:
            self.framer.discard()
            return
        buffers = self.framer.flush(last)
        if buffers:
            transport.writelines(buffers)
