"""One ``/metrics`` view across the ``--workers N`` HTTP processes.

Each process listens on a Unix socket ``<dir>/<pid>.sock`` (the directory is made by the
supervisor) and answers every connection with its own exposition, then closes. The
process that receives a scrape reads its own metrics and every sibling's, and sums them
(``metrics.merge_expositions``), so one scrape shows every request whichever process
served it. Only scrapes pay for this; nothing on the request path changes.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from pathlib import Path

from .. import metrics

log = logging.getLogger("zeroserve.server")

# Seconds to wait for one sibling's exposition. A sibling that does not answer in this
# time (stuck loop, dying) is left out of the scrape rather than stalling it; Prometheus'
# default scrape timeout is 10 s.
PEER_SCRAPE_TIMEOUT_S = 2.0
# Largest exposition read from a sibling, bytes (ours are tens of KiB).
PEER_MAX_BYTES = 16 * 1024 * 1024


class MetricsPeers:
    def __init__(self, directory: str) -> None:
        self.directory = Path(directory)
        self.path = self.directory / f"{os.getpid()}.sock"
        self._server: asyncio.AbstractServer | None = None

    async def start(self) -> None:
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()
        self._server = await asyncio.start_unix_server(self._answer, path=str(self.path))

    async def _answer(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            writer.write(metrics.exposition())
            await writer.drain()
        except (ConnectionError, OSError):
            pass
        finally:
            writer.close()

    async def scrape(self) -> bytes:
        """This process's metrics summed with every sibling's that answers in time."""
        own = metrics.exposition()
        peers = [p for p in self.directory.glob("*.sock") if p != self.path]
        texts = await asyncio.gather(*(self._read(p) for p in peers))
        return metrics.merge_expositions([own, *(t for t in texts if t is not None)])

    async def _read(self, path: Path) -> bytes | None:
        try:
            async with asyncio.timeout(PEER_SCRAPE_TIMEOUT_S):
                reader, writer = await asyncio.open_unix_connection(str(path))
                try:
                    data = bytearray()
                    while chunk := await reader.read(64 * 1024):
                        data += chunk
                        if len(data) > PEER_MAX_BYTES:
                            raise OSError("exposition too large")
                    return bytes(data)
                finally:
                    writer.close()
        except (OSError, TimeoutError) as exc:
            log.debug("metrics peer %s did not answer: %s", path.name, exc)
            return None

    async def aclose(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()
