"""A hung process worker whose client left is reclaimed within the hang grace after the
disconnect, not after the request's deadline
(docs/decisions/0025-abandoned-work-grace-starts-at-abandonment.md).

A real ``zeroserve serve`` with the default 300 s deadline and a 0.5 s hang grace: a raw
call and a stream hang in the model's only worker, and their client disconnects. While
the respawn is held at its load, ``/ready`` is 503 naming the model and why, a new request
is refused with 503 and ``Retry-After`` instead of queueing, and the other model serves;
once released, the model answers again. Every wait is far below the deadline, so a pass
means the reclaim came from the disconnect.
"""

from __future__ import annotations

import json
import os
import socket
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.support import ServerProcess, start_server, wait_until
from tests.support.observe import assert_restarting, model_metric, release_fifo

MODEL = "hang"
GRACE_S = 0.5
# The longest a test waits for the server to reach a state (scaled by the suite's factor);
# the deadline it must not depend on is 300 s.
WAIT_S = 30.0


class Hung:
    """The server and what its hanging model tells the test."""

    def __init__(self, server: ServerProcess, marks: Path, hold: str) -> None:
        self.server = server
        self.marks = marks
        self.hold = hold

    def events(self, event: str) -> int:
        if not self.marks.exists():
            return 0
        return self.marks.read_text().split().count(event)

    def reclaimed(self) -> float:
        return model_metric(self.server.url, "zeroserve_workers_reclaimed_total", MODEL)

    def release(self) -> bool:
        """Let the held respawn load; False while no worker reads the FIFO yet."""
        return release_fifo(self.hold)


@pytest.fixture(scope="module")
def hung(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Hung]:
    tmp = tmp_path_factory.mktemp("abandoned")
    marks, hold = tmp / "marks", str(tmp / "hold")
    os.mkfifo(hold)
    spec = f"{MODEL}=tests.support.models.hanging:HangOnRequest?marks={marks}&hold={hold}"
    server = start_server(
        "--model",
        spec,
        "--model",
        "echo",
        "--request-timeout",
        "300",
        env={"ZEROSERVE_RUNTIME__HANG_GRACE_S": str(GRACE_S)},
    )
    try:
        yield Hung(server, marks, hold)
    finally:
        assert server.stop() == 0


def request(path: str, body: bytes, content_type: str = "application/octet-stream") -> bytes:
    return (
        f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: {content_type}\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    ).encode() + body


def reclaimed_then_served(hung: Hung, before: float, loads: int) -> None:
    """The worker is reclaimed; while its respawn is held the model says so and refuses
    at the head; released, it answers again."""
    url = hung.server.url
    wait_until(lambda: hung.reclaimed() == before + 1, WAIT_S, "the worker reclaimed")
    wait_until(lambda: hung.events("load") == loads + 1, WAIT_S, "the respawn loading")
    assert_restarting(url, MODEL, "1 of 1 workers restarting")
    wait_until(hung.release, WAIT_S, "the respawn reading its hold")
    wait_until(
        lambda: httpx.get(f"{url}/ready", timeout=WAIT_S).status_code == 200,
        WAIT_S,
        "the respawned worker ready",
    )
    r = httpx.post(f"{url}/v1/raw/{MODEL}", content=b"again", timeout=WAIT_S)
    assert (r.status_code, r.content) == (200, b"again")


def test_a_raw_call_whose_client_left_is_reclaimed(hung: Hung) -> None:
    before, loads, hangs = hung.reclaimed(), hung.events("load"), hung.events("hung")
    server = hung.server
    with socket.create_connection((server.host, server.port), timeout=WAIT_S) as client:
        client.sendall(request(f"/v1/raw/{MODEL}", b"hang"))
        wait_until(lambda: hung.events("hung") == hangs + 1, WAIT_S, "the call hanging")
    # The client is gone; the request's deadline is 300 s away.
    reclaimed_then_served(hung, before, loads)


def test_a_stream_whose_client_left_is_reclaimed(hung: Hung) -> None:
    before, loads, hangs = hung.reclaimed(), hung.events("load"), hung.events("hung")
    server = hung.server
    body = json.dumps({"model": MODEL, "prompt": "hang", "stream": True}).encode()
    with socket.create_connection((server.host, server.port), timeout=WAIT_S) as client:
        client.sendall(request("/v1/completions", body, "application/json"))
        received = b""
        while b"first" not in received:
            chunk = client.recv(65536)
            assert chunk, received
            received += chunk
        assert received.startswith(b"HTTP/1.1 200")
        wait_until(lambda: hung.events("hung") == hangs + 1, WAIT_S, "the step hanging")
    reclaimed_then_served(hung, before, loads)
