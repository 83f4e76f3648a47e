"""Waiting in tests without assuming this machine's speed (CONTRIBUTING.md, "Tests").

Every wait for a good outcome is a poll with a deadline, and every deadline is scaled by one
factor the suite sets: ``ZEROSERVE_TEST_SLOWDOWN`` (default 1; a busy machine sets more).
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, TypeVar

SLOWDOWN_VARIABLE = "ZEROSERVE_TEST_SLOWDOWN"
T = TypeVar("T")


def slowdown() -> float:
    """The suite's one slowdown factor, read from the environment on every call."""
    raw = os.environ.get(SLOWDOWN_VARIABLE, "1")
    try:
        factor = float(raw)
    except ValueError as error:
        raise ValueError(f"{SLOWDOWN_VARIABLE} must be a number, got {raw!r}") from error
    if not factor >= 1:
        raise ValueError(f"{SLOWDOWN_VARIABLE} must be >= 1, got {raw!r}")
    return factor


def scaled(seconds: float) -> float:
    """A wait of ``seconds`` on a quiet machine, scaled by the suite's slowdown factor."""
    return seconds * slowdown()


def wait_until(predicate: Callable[[], T], timeout: float, what: str, interval: float = 0.01) -> T:
    """Poll ``predicate`` until it returns a truthy value; fail naming ``what`` after ``timeout``.

    ``timeout`` is scaled here, so callers pass the quiet-machine figure.
    """
    deadline = time.monotonic() + scaled(timeout)
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {scaled(timeout):.1f}s waiting for {what}")
        time.sleep(interval)


async def await_until(
    predicate: Callable[[], Awaitable[T]], timeout: float, what: str, interval: float = 0.01
) -> T:
    """The coroutine form of ``wait_until``, for tests running on an event loop."""
    deadline = time.monotonic() + scaled(timeout)
    while True:
        value = await predicate()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {scaled(timeout):.1f}s waiting for {what}")
        await asyncio.sleep(interval)


# A test body on an event loop that has not finished in this long (quiet machine, scaled)
# has hung.
ASYNC_BODY_TIMEOUT_S = 60.0


def run_async(coro: Coroutine[Any, Any, T], timeout: float = ASYNC_BODY_TIMEOUT_S) -> T:
    """Run an async test body on a fresh loop in the test's thread, bounded (scaled)."""
    return asyncio.run(asyncio.wait_for(coro, scaled(timeout)))
