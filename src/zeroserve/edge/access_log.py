"""The access log: one JSON line per request, written off the event loop.

Strategy
--------
The loop only builds an ``AccessRecord`` (a few fields, never a body) and puts it into a
bounded queue without waiting. A writer thread encodes records with msgspec and writes
whatever is queued in one ``write`` and one ``flush``. A slow or stalled disk therefore
fills the queue, never the loop: past ``QUEUE_RECORDS`` records are dropped and counted
(``dropped``; records lost to a write error are ``failed``), because a server that stops serving to keep its log complete is worse than
a log with a counted gap.
"""

from __future__ import annotations

import queue
import sys
import threading
from collections.abc import Callable
from typing import IO, Literal

import msgspec

# Records waiting for the writer. At 50k requests/s this is 0.3 s of a stalled disk, and
# at ~300 bytes per record it bounds the queue to a few MiB.
QUEUE_RECORDS = 16384
# Records the writer takes per write (one write+flush per batch).
BATCH_RECORDS = 512

Outcome = Literal["done", "client_gone", "deadline", "rejected", "error"]


class AccessRecord(msgspec.Struct, omit_defaults=True):
    """What one request did. ``key`` is the API key's *name*; ``path`` has no query."""

    time: float
    request_id: str
    method: str
    path: str
    status: int
    outcome: Outcome
    duration_s: float
    bytes_in: int
    bytes_out: int
    model: str | None = None
    key: str | None = None
    ttft_s: float | None = None
    tokens: int | None = None
    load_wait_s: float | None = None  # the wait for the model's load (autoload), if any


class AccessLog:
    """Writes records to ``stream`` (or the file at ``path``; ``"-"`` is stderr) from a
    writer thread. ``log(record)`` never blocks; ``close()`` writes what is queued."""

    def __init__(
        self,
        path: str = "-",
        *,
        stream: IO[bytes] | None = None,
        queue_records: int = QUEUE_RECORDS,
        on_error: Callable[[BaseException], None] | None = None,
    ) -> None:
        if stream is None:
            stream = sys.stderr.buffer if path == "-" else open(path, "ab")  # noqa: SIM115
            self._owned = path != "-"
        else:
            self._owned = False
        self._stream = stream
        self._queue: queue.Queue[AccessRecord | None] = queue.Queue(queue_records)
        self._on_error = on_error
        self.written = 0  # records written (writer thread)
        self.failed = 0  # records lost to a write error (writer thread)
        self.dropped = 0  # records refused by a full queue (the loop's thread)
        self._thread = threading.Thread(
            target=self._write, name="zeroserve-access-log", daemon=True
        )
        self._thread.start()

    def log(self, record: AccessRecord) -> None:
        try:
            self._queue.put_nowait(record)
        except queue.Full:
            self.dropped += 1

    def _write(self) -> None:
        encoder = msgspec.json.Encoder()
        buf = bytearray()
        q = self._queue
        while True:
            record = q.get()
            stop = record is None
            buf.clear()
            n = 0
            while record is not None:
                encoder.encode_into(record, buf, -1)
                buf += b"\n"
                n += 1
                if n >= BATCH_RECORDS:
                    break
                try:
                    record = q.get_nowait()
                except queue.Empty:
                    break
                if record is None:
                    stop = True
            if buf:
                try:
                    self._stream.write(buf)
                    self._stream.flush()
                    self.written += n
                except (OSError, ValueError) as exc:
                    self.failed += n
                    if self._on_error is not None:
                        self._on_error(exc)
            if stop:
                return

    def close(self, timeout: float = 5.0) -> None:
        """Write what is queued, then stop the writer (waits at most ``timeout`` s)."""
        if not self._thread.is_alive():
            return
        try:
            self._queue.put(None, timeout=timeout)
        except queue.Full:
            pass
        self._thread.join(timeout)
        if self._owned:
            self._stream.close()
