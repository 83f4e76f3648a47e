"""Measure the relay's overhead, and the upstream-client choice behind it (docs/gateway.md).

Run: ``.venv/bin/python -m benchmarks.scripts.measure_overhead [--requests N]`` from the
repository root. It prints two tables. It is the one part of ``benchmarks/`` that imports
zeroserve internals: the gateway's upstream client, timed in-process against aiohttp and
httpx (``docs/architecture.md``, "Benchmarks").

1. **Upstream client.** The same sequential small POSTs (a 1 KiB chat-like JSON body to
   an ``echo`` zeroserve in another process, keep-alive) through each candidate client in
   one uvloop process: our pooled httptools client (``app.relay``), aiohttp and httpx.
   The upstream and the network are the same for all, so the differences are the
   clients' own cost per request.
2. **Gateway overhead.** Sequential requests from a raw-socket client straight to the
   upstream and through a gateway process (``remote:`` model, same upstream): the
   difference of the latencies is what relaying adds, including the extra loopback hop.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import socket
import statistics
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

from ..machine import Pinning
from ..servers import start, zeroserve
from ..stats import percentile

RESULTS = Path("bench-results")

BODY = (
    b'{"model":"echo","messages":[{"role":"user","content":"'
    + b"lorem ipsum " * 80
    + b'"}],"max_tokens":16}'
)


def row(name: str, xs: list[float]) -> str:
    us = [x * 1e6 for x in xs]
    return f"| {name:<28} | {percentile(us, 50):8.1f} | {percentile(us, 99):8.1f} | {statistics.fmean(us):8.1f} |"


async def timed(n: int, call: Callable[[], Awaitable[None]]) -> list[float]:
    for _ in range(max(50, n // 10)):  # warm-up: connections, caches
        await call()
    out = []
    for _ in range(n):
        t = time.perf_counter()
        await call()
        out.append(time.perf_counter() - t)
    return out


async def clients(url: str, n: int) -> list[str]:
    from zeroserve.models.remote import RemoteModel
    from zeroserve.upstream import Upstream

    lines = []
    cfg = RemoteModel(location=f"{url}/v1").config
    up = Upstream(cfg.upstreams[0], cfg)
    head = (
        b"POST /v1/raw/echo HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
        b"content-length: %d\r\n\r\n" % len(BODY)
    )
    body = memoryview(BODY)

    async def ours() -> None:
        loop = asyncio.get_running_loop()
        ex, _, _ = await up.exchange("POST", [head, body], loop.time() + 10)
        got = 0
        while (batch := await ex.next_batch()) is not None:
            got += sum(v.nbytes for v in batch)
        ex.finish(True)
        assert got == len(BODY)

    lines.append(row("zeroserve relay client", await timed(n, ours)))
    await up.aclose()
    try:
        import aiohttp

        async with aiohttp.ClientSession() as s:

            async def aio() -> None:
                async with s.post(f"{url}/v1/raw/echo", data=BODY) as r:
                    assert len(await r.read()) == len(BODY)

            lines.append(row(f"aiohttp {aiohttp.__version__}", await timed(n, aio)))
    except ImportError:
        lines.append("| aiohttp (not installed) | | | |")
    try:
        import httpx

        async with httpx.AsyncClient() as c:

            async def hx() -> None:
                r = await c.post(f"{url}/v1/raw/echo", content=BODY)
                assert len(r.content) == len(BODY)

            lines.append(row(f"httpx {httpx.__version__}", await timed(n, hx)))
    except ImportError:
        lines.append("| httpx (not installed) | | | |")
    return lines


def sequential(port: int, path: str, n: int) -> list[float]:
    """A minimal blocking keep-alive client: as little client noise as possible."""
    s = socket.create_connection(("127.0.0.1", port))
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    req = (
        b"POST %s HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n"
        % (path.encode(), len(BODY))
        + BODY
    )
    buf = bytearray(1 << 16)
    out = []
    for i in range(n + max(50, n // 10)):
        t = time.perf_counter()
        s.sendall(req)
        got = b""
        while True:
            k = s.recv_into(buf)
            got += buf[:k]
            end = got.find(b"\r\n\r\n")
            if end >= 0:
                length = int(got.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
                if len(got) - end - 4 >= length:
                    break
        if i >= max(50, n // 10):
            out.append(time.perf_counter() - t)
    s.close()
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--requests", type=int, default=3000)
    args = ap.parse_args()
    os.environ.setdefault("ZEROSERVE_LOG_LEVEL", "warning")
    pins = Pinning(None, None)
    upstream = start(zeroserve("echo", name="upstream", extra=("--loop", "uvloop")), pins, RESULTS)
    url = f"http://127.0.0.1:{upstream.port}"
    gw = start(
        zeroserve(
            f"g=remote:{url}/v1?upstream_model=echo", name="gateway", extra=("--loop", "uvloop")
        ),
        pins,
        RESULTS,
    )
    try:
        import uvloop

        header = "| client | p50 µs | p99 µs | mean µs |\n|---|---:|---:|---:|"
        print("Upstream clients, sequential 1 KiB POSTs, keep-alive, one uvloop process\n")
        print(header)
        print("\n".join(uvloop.run(clients(url, args.requests))))
        direct = sequential(upstream.port, "/v1/raw/echo", args.requests)
        relayed = sequential(gw.port, "/v1/raw/g", args.requests)
        print("\nGateway overhead, sequential, raw-socket client\n")
        print(header.replace("client", "path"))
        print(row("direct to upstream", direct))
        print(row("through the gateway", relayed))
        added = [(percentile(relayed, p) - percentile(direct, p)) * 1e6 for p in (50, 99)]
        print(f"\nadded by the gateway: p50 {added[0]:.1f} µs, p99 {added[1]:.1f} µs")
    finally:
        gw.stop()
        upstream.stop()


if __name__ == "__main__":
    main()
