"""Unlucky operators and hostile clients, over loopback: a storm of reset streams, a
bounded soak (RSS and fd bounds), and overload followed by recovery. Each ends with every
gauge back to idle."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys

import httpx

from tests.support import ServerThread, scaled, wait_until

# How long a test waits for the server to settle (streams closed, tickets released).
SETTLE_S = 30.0
CLIENT_WAIT_S = scaled(10.0)
# Streams opened and reset in the storm, ROUND at a time (under the queue depth of 64).
STORM = 200
ROUND = 50
STORM_CLIENT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "storm_client.py")
# The whole storm, every round's connects and first reads (each bounded by CLIENT_WAIT_S).
STORM_CLIENT_TIMEOUT_S = scaled(120.0)
# Requests in the soak, after a warm-up that fills caches and pools.
SOAK = 3000
WARMUP = 300
# Growth allowed over the soak: an allocator's noise, far below a per-request leak
# (3,000 leaked 4 KiB bodies would be 12 MiB).
SOAK_RSS_BOUND_BYTES = 8 << 20
# Requests sent at once against a queue of QUEUE_DEPTH.
BURST = 150


def engine_idle(srv: ServerThread) -> bool:
    async def read() -> bool:
        assert srv.engine is not None
        s = srv.engine.statistics()
        return (
            all(
                m.queue.in_flight == 0 and m.workers.busy == 0 and m.workers.streams == 0
                for m in s.models.values()
            )
            and s.channels.open == 0
            and s.arena.leases == 0
        )

    return srv.call(read())


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def test_disconnect_storm_leaves_nothing_behind(server: ServerThread) -> None:
    wait_until(lambda: engine_idle(server), SETTLE_S, "idle before")
    fds = open_fds()
    # The client runs in its own process: in this one it would be starved of the GIL by
    # the server's busy loop (see storm_client.py).
    client = subprocess.run(
        [
            sys.executable,
            STORM_CLIENT,
            str(server.port),
            str(STORM),
            str(ROUND),
            str(CLIENT_WAIT_S),
        ],
        capture_output=True,
        text=True,
        timeout=STORM_CLIENT_TIMEOUT_S,
    )
    assert client.returncode == 0, client.stderr
    wait_until(lambda: engine_idle(server), SETTLE_S, "every stream closed")
    wait_until(lambda: open_fds() <= fds, SETTLE_S, "every connection fd closed")
    r = httpx.post(server.url + "/v1/raw/echo", content=b"still here", timeout=CLIENT_WAIT_S)
    assert r.content == b"still here"


def test_bounded_soak(server: ServerThread) -> None:
    body = os.urandom(4096)
    with httpx.Client(base_url=server.url, timeout=CLIENT_WAIT_S) as client:
        for _ in range(WARMUP):
            assert client.post("/v1/raw/echo", content=body).content == body
        wait_until(lambda: engine_idle(server), SETTLE_S, "idle after warm-up")
        fds, rss = open_fds(), rss_bytes()
        for i in range(SOAK):
            if i % 3 == 0:
                r = client.post("/v1/raw/echo", content=body)
                assert r.content == body
            elif i % 3 == 1:
                r = client.post("/v1/embeddings", json={"model": "echo", "input": ["a", "b"]})
                assert r.status_code == 200
            else:
                r = client.post("/v1/embeddings", content=b"[" * 5000)  # hostile: a 400
                assert r.status_code == 400
    wait_until(lambda: engine_idle(server), SETTLE_S, "idle after the soak")
    assert open_fds() <= fds
    assert rss_bytes() - rss < SOAK_RSS_BOUND_BYTES


async def _burst(srv: ServerThread) -> list[httpx.Response]:
    limits = httpx.Limits(max_connections=BURST)
    async with httpx.AsyncClient(base_url=srv.url, timeout=CLIENT_WAIT_S, limits=limits) as c:
        return await asyncio.gather(
            *(c.post("/v1/raw/stall?timeout=1", content=b"x") for _ in range(BURST))
        )


def test_overload_then_recovery(server: ServerThread) -> None:
    answers = asyncio.run(_burst(server))
    statuses = sorted(r.status_code for r in answers)
    # The queue admits its depth (they end at their 1 s deadline); the rest are refused
    # at once with Retry-After.
    assert set(statuses) <= {429, 504}, statuses
    refused = [r for r in answers if r.status_code == 429]
    assert refused and all(int(r.headers["retry-after"]) >= 1 for r in refused)
    assert statuses.count(504) > 0
    wait_until(lambda: engine_idle(server), SETTLE_S, "idle after the burst")
    # Recovered: admitted again (a 504 from its own deadline, not a 429).
    r = httpx.post(server.url + "/v1/raw/stall?timeout=0.2", content=b"x", timeout=CLIENT_WAIT_S)
    assert r.status_code == 504
    assert httpx.get(server.url + "/ready", timeout=CLIENT_WAIT_S).status_code == 200
