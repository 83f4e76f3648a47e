"""The disconnect storm's client, run in its own process by ``test_resilience``.

A client thread in the server's own process is starved of the GIL while the server's loop
is busy: the loop releases and retakes the GIL around every poll, so a waiting thread's
switch interval restarts and it never gets a turn (CPython's convoy effect) until every
stream is paused by backpressure. Measured on this suite's storm: 1 to 12 s per round with
the client in the server's process, 0.03 to 0.07 s with it in its own; past the server's
10 s head timeout the late requests were cut off unanswered. Real clients are other
processes, so this one is too.

Usage: ``python storm_client.py PORT STREAMS ROUND TIMEOUT_S``. Exits 0 when every stream
answered 200 before it was reset, else 1 with what it got on stderr.
"""

from __future__ import annotations

import socket
import struct
import sys

REQUEST = (
    b"POST /v1/raw/echo?stream=1&max_tokens=4000000 HTTP/1.1\r\nhost: x\r\n"
    b"content-length: 11\r\n\r\nhello world"
)


def storm(port: int, streams: int, per_round: int, timeout_s: float) -> int:
    for _ in range(streams // per_round):
        socks = [
            socket.create_connection(("127.0.0.1", port), timeout=timeout_s)
            for _ in range(per_round)
        ]
        try:
            for s in socks:
                s.sendall(REQUEST)
            for i, s in enumerate(socks):
                first = s.recv(4096)
                if not first.startswith(b"HTTP/1.1 200"):  # each stream must be running
                    print(f"stream {i} answered {first[:80]!r}", file=sys.stderr)
                    return 1
        finally:
            for s in socks:
                # Reset, not close: the server sees ECONNRESET mid-stream.
                s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                s.close()
    return 0


if __name__ == "__main__":
    port, streams, per_round, timeout_s = sys.argv[1:5]
    sys.exit(storm(int(port), int(streams), int(per_round), float(timeout_s)))
