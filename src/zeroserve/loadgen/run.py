"""The bounded load loop: ``concurrency`` workers on their own keep-alive connections,
each sending the plan's request back to back until the count or the time is spent.

Bounds: at most ``requests`` requests are started (a shared counter; with ``--duration``
the count is :data:`MAX_REQUESTS`), none is started after the deadline, and every request
has its own timeout, so a run ends within its duration plus one timeout. A failed
request (status >= 400, timeout, connection or framing error) is counted by its status or
its kind and the worker goes on with a fresh connection.
"""

from __future__ import annotations

import asyncio
import sys
import time
from dataclasses import dataclass, field
from typing import TextIO

from .client import Connection, MalformedResponse, Target
from .endpoints import Plan, TokenCounter

# The most requests one run may start (also the bound of a --duration run).
MAX_REQUESTS = 10_000_000
# The most concurrent connections (each is a socket and a task in this process).
MAX_CONCURRENCY = 10_000
# Longest a run may last (--duration above it is refused).
MAX_DURATION_S = 24 * 3600.0
# The progress bar is redrawn at most this often.
PROGRESS_INTERVAL_S = 0.1
PROGRESS_WIDTH = 30


@dataclass
class Result:
    """One request: its status (0 when no answer), or the kind of failure."""

    ok: bool
    status: int
    error: str  # "" when ok; else the status ("429") or a kind ("timeout")
    start: float
    end: float
    tokens: int = 0
    token_times: list[float] = field(default_factory=list)

    @property
    def latency_s(self) -> float:
        return self.end - self.start


@dataclass
class Run:
    results: list[Result]
    started: float
    ended: float

    @property
    def duration_s(self) -> float:
        return self.ended - self.started


class Progress:
    """A plain progress bar on a text stream (stderr): done / total, or seconds left."""

    def __init__(self, out: TextIO | None, total: int | None, duration_s: float | None) -> None:
        self._out, self._total, self._duration = out, total, duration_s
        self._last = 0.0
        self._t0 = time.perf_counter()

    def update(self, done: int, errors: int, force: bool = False) -> None:
        if self._out is None:
            return
        now = time.perf_counter()
        if not force and now - self._last < PROGRESS_INTERVAL_S:
            return
        self._last = now
        elapsed = now - self._t0
        if self._duration is not None:
            frac = min(1.0, elapsed / self._duration) if self._duration else 1.0
            where = f"{elapsed:5.1f}/{self._duration:g} s"
        else:
            frac = done / self._total if self._total else 1.0
            where = f"{done}/{self._total}"
        filled = int(frac * PROGRESS_WIDTH)
        rate = done / elapsed if elapsed > 0 else 0.0
        self._out.write(
            f"\r[{'#' * filled}{'.' * (PROGRESS_WIDTH - filled)}] {where} "
            f"{done} done, {errors} errors, {rate:,.1f} req/s "
        )
        self._out.flush()

    def close(self) -> None:
        if self._out is not None:
            self._out.write("\n")
            self._out.flush()


async def _one(conn: Connection, raw: bytes, plan: Plan, timeout_s: float) -> Result:
    counter = TokenCounter(plan)
    start = time.perf_counter()
    try:
        async with asyncio.timeout(timeout_s):
            resp = await conn.request(raw, counter.feed)
    except TimeoutError:
        return Result(False, 0, "timeout", start, time.perf_counter())
    except ConnectionRefusedError:
        return Result(False, 0, "connect (refused)", start, time.perf_counter())
    except (ConnectionError, asyncio.IncompleteReadError) as exc:
        return Result(False, 0, f"connection ({type(exc).__name__})", start, time.perf_counter())
    except OSError as exc:
        return Result(
            False, 0, f"connect ({exc.strerror or type(exc).__name__})", start, time.perf_counter()
        )
    except (MalformedResponse, ValueError, asyncio.LimitOverrunError) as exc:
        return Result(False, 0, f"protocol ({exc})"[:80], start, time.perf_counter())
    end = time.perf_counter()
    if resp.status >= 400:
        return Result(False, resp.status, str(resp.status), start, end)
    tokens = counter.finish()
    return Result(True, resp.status, "", start, end, tokens, counter.token_times)


async def run(
    target: Target,
    plan: Plan,
    extra_headers: dict[str, str],
    concurrency: int,
    requests: int | None,
    duration_s: float | None,
    timeout_s: float,
    progress: TextIO | None = sys.stderr,
) -> Run:
    """Drive the load; ``requests`` or ``duration_s`` (one of them) bounds it."""
    name = f"[{target.host}]" if ":" in target.host else target.host  # IPv6 literal
    host = name if target.port in (80, 443) else f"{name}:{target.port}"
    raw = plan.request(host, extra_headers)
    limit = requests if requests is not None else MAX_REQUESTS
    bar = Progress(progress, requests, duration_s)
    results: list[Result] = []
    started = 0
    errors = 0
    t0 = time.perf_counter()
    deadline = t0 + duration_s if duration_s is not None else None

    async def worker() -> None:
        nonlocal started, errors
        conn = Connection(target)
        try:
            while started < limit and (deadline is None or time.perf_counter() < deadline):
                started += 1
                r = await _one(conn, raw, plan, timeout_s)
                results.append(r)
                errors += not r.ok
                bar.update(len(results), errors)
        finally:
            await conn.close()

    try:
        await asyncio.gather(*(worker() for _ in range(min(concurrency, limit))))
    finally:
        bar.update(len(results), errors, force=True)
        bar.close()
    return Run(results, t0, time.perf_counter())
