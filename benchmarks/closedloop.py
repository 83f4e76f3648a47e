"""The harness's closed-loop httpx client: ``clients`` workers share one pooled
``httpx.AsyncClient`` and each sends its next request as soon as its last one is
answered, until a window of ``seconds`` ends. Each answered request's latency is kept
(the whole call, whatever ``call`` reads of the answer); a failed one is counted, with
the first few reasons. A task ``beside`` the workers may share the client (and the
result) for the window's length: the replace suite's replacer."""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

import httpx

from .procs import LOOPBACK

# Reasons kept per window (the first ones: the rest repeat them).
KEPT_ERRORS = 3
# What a failed request raises: transport and status errors, and a malformed answer.
FAILURES = (httpx.HTTPError, ValueError, KeyError)


@dataclass
class Window:
    """What one window measured: every answered request's latency, the failures and
    the first reasons, and the window's length (from its start to its last answer)."""

    latencies_s: list[float] = field(default_factory=list)
    failures: int = 0
    errors: list[str] = field(default_factory=list)
    duration_s: float = 0.0

    @property
    def requests(self) -> int:
        return len(self.latencies_s)

    @property
    def rate(self) -> float:
        """Answered requests per second (NaN for an empty window)."""
        return self.requests / self.duration_s if self.duration_s else math.nan

    def failed(self, exc: BaseException) -> None:
        self.failures += 1
        if len(self.errors) < KEPT_ERRORS:
            self.errors.append(f"{type(exc).__name__}: {exc}"[:160])


Call = Callable[[httpx.AsyncClient], Awaitable[object]]
# (the shared client, the window's start on time.monotonic(), the window) -> done.
Beside = Callable[[httpx.AsyncClient, float, Window], Awaitable[None]]


async def closed_loop(
    port: int,
    call: Call,
    clients: int,
    seconds: float,
    *,
    timeout_s: float,
    spare_connections: int = 0,
    beside: Beside | None = None,
) -> Window:
    """Run ``clients`` workers calling ``call`` back to back for ``seconds`` on one client
    of ``clients + spare_connections`` pooled connections to 127.0.0.1:``port`` (each
    request bounded by ``timeout_s``), with ``beside`` alongside."""
    out = Window()
    conns = clients + spare_connections
    limits = httpx.Limits(max_connections=conns, max_keepalive_connections=conns)
    async with httpx.AsyncClient(
        base_url=f"http://{LOOPBACK}:{port}", limits=limits, timeout=timeout_s
    ) as client:
        start = time.monotonic()
        end = start + seconds

        async def worker() -> None:
            while time.monotonic() < end:
                t0 = time.monotonic()
                try:
                    await call(client)
                except FAILURES as exc:
                    out.failed(exc)
                else:
                    out.latencies_s.append(time.monotonic() - t0)

        tasks: list[Awaitable[None]] = [worker() for _ in range(clients)]
        if beside is not None:
            tasks.append(beside(client, start, out))
        await asyncio.gather(*tasks)
        out.duration_s = time.monotonic() - start
    return out
