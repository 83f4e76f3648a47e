"""The access log's writer thread and the edge's start/admit/finish cycle."""

from __future__ import annotations

import io
import json
import threading
from typing import Any

import pytest

from tests.support import scaled
from zeroserve.edge import AccessLog, AccessRecord, ApiKey, Edge, EdgeEnd, EdgeOptions, KeyLimits
from zeroserve.errors import RateLimited, Unauthorized

SECRET = b"sk-alice-secret-31337"
BEARER = [(b"authorization", b"Bearer " + SECRET)]


class Clock:
    def __init__(self) -> None:
        self.now = 50.0

    def __call__(self) -> float:
        return self.now


class BlockedDisk(io.RawIOBase):
    """A stream whose writes wait until ``unblock`` is set: a stalled disk."""

    def __init__(self) -> None:
        self.unblock = threading.Event()
        self.entered = threading.Event()
        self.data = bytearray()

    def writable(self) -> bool:
        return True

    def write(self, b: Any) -> int:
        self.entered.set()
        assert self.unblock.wait(scaled(30))
        self.data += b
        return len(b)


def record(i: int) -> AccessRecord:
    return AccessRecord(
        time=1.5,
        request_id=f"r{i}",
        method="GET",
        path="/health",
        status=200,
        outcome="done",
        duration_s=0.001,
        bytes_in=0,
        bytes_out=0,
    )


def test_a_stalled_disk_never_blocks_logging_and_drops_are_counted() -> None:
    disk = BlockedDisk()
    log = AccessLog(stream=disk, queue_records=8)  # type: ignore[arg-type]
    log.log(record(0))
    assert disk.entered.wait(scaled(30))  # the writer is stuck inside write()
    for i in range(1, 20):  # returns at once although nothing can be written
        log.log(record(i))
    assert log.dropped == 20 - 1 - 8
    disk.unblock.set()
    log.close()
    lines = [json.loads(x) for x in disk.data.decode().splitlines()]
    assert [x["request_id"] for x in lines] == [f"r{i}" for i in range(9)]
    assert log.written == 9
    assert lines[0] == {
        "time": 1.5,
        "request_id": "r0",
        "method": "GET",
        "path": "/health",
        "status": 200,
        "outcome": "done",
        "duration_s": 0.001,
        "bytes_in": 0,
        "bytes_out": 0,
    }


def edge_with(clock: Clock, out: io.BytesIO, **kw: Any) -> Edge:
    keys = (ApiKey("alice", SECRET, KeyLimits(requests_per_minute=2)),)
    return Edge(
        EdgeOptions(keys=keys, **kw),
        clock=clock,
        wall=lambda: 1e9,
        access_log=AccessLog(stream=out),
    )


def test_open_paths_need_no_key_and_metrics_can_be_closed() -> None:
    out = io.BytesIO()
    edge = edge_with(Clock(), out)
    for path in ("/health", "/ready", "/metrics", "/v2/health/ready"):
        edge.admit(edge.start("GET", []), path, "")
    with pytest.raises(Unauthorized):
        edge.admit(edge.start("GET", []), "/v1/models", "")
    closed = Edge(EdgeOptions(keys=(ApiKey("a", b"k"),), auth_metrics=True))
    with pytest.raises(Unauthorized):
        closed.admit(closed.start("GET", []), "/metrics", "")
    edge.close()
    closed.close()


def test_one_request_cycle_logs_the_key_name_never_the_key() -> None:
    clock, out = Clock(), io.BytesIO()
    edge = edge_with(clock, out)
    ctx = edge.start("POST", [(b"x-request-id", b"req-42"), *BEARER])
    edge.admit(ctx, "/v1/completions", "")
    assert ctx.key_name == "alice"
    h = dict(ctx.headers)
    assert h[b"x-request-id"] == b"req-42" and h[b"x-ratelimit-remaining-requests"] == b"1"
    ctx.model = "echo"
    ctx.count_tokens(7)
    ctx.ttft_s = 0.25
    clock.now += 1.5
    ctx.status, ctx.bytes_out = 200, 99
    edge.finish(ctx, EdgeEnd("POST", "/v1/completions", bytes_in=10))
    assert edge.statistics()["alice"].in_flight == 0
    assert edge.statistics()["alice"].tokens == 7
    ctx2 = edge.start("GET", BEARER)
    edge.admit(ctx2, "/v1/models", "")
    ctx2.status = 200
    edge.finish(ctx2, EdgeEnd("GET", "/v1/models"))
    with pytest.raises(RateLimited):
        edge.admit(edge.start("GET", BEARER), "/v1/models", "")
    edge.close()
    text = out.getvalue()
    assert SECRET not in text
    first = json.loads(text.splitlines()[0])
    assert first == {
        "time": 1e9,
        "request_id": "req-42",
        "method": "POST",
        "path": "/v1/completions",
        "status": 200,
        "outcome": "done",
        "duration_s": 1.5,
        "bytes_in": 10,
        "bytes_out": 99,
        "model": "echo",
        "key": "alice",
        "ttft_s": 0.25,
        "tokens": 7,
    }


def test_a_preflight_is_marked_and_needs_no_key() -> None:
    edge = Edge(EdgeOptions(keys=(ApiKey("a", b"k"),), cors_origins=("https://app.example",)))
    ctx = edge.start(
        "OPTIONS",
        [(b"origin", b"https://app.example"), (b"access-control-request-method", b"POST")],
    )
    assert ctx.preflight
    assert dict(ctx.headers)[b"access-control-allow-origin"] == b"https://app.example"
    edge.close()


def test_unconfigured_edge_only_stamps_request_ids() -> None:
    edge = Edge()
    ctx = edge.start("POST", [(b"origin", b"https://x.example")])
    edge.admit(ctx, "/v1/completions", "api_key=whatever")
    assert [n for n, _ in ctx.headers] == [b"x-request-id"]
    edge.finish(ctx, EdgeEnd("POST", "/v1/completions", "done"))
    assert not EdgeOptions().active
