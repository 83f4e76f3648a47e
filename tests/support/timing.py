"""Waiting in tests without assuming this machine's speed (CONTRIBUTING.md, "Tests").

Every wait for a good outcome is a poll with a deadline, and every deadline is scaled by one
factor the suite sets: ``ZEROSERVE_TEST_SLOWDOWN`` (default 1; a busy machine sets more).
``make test`` sets it from the machine's load when the runner gives none
(``machine_slowdown``; docs/decisions/0048-slowdown-from-load.md). A wait on model work,
which runs nice levels below everything else (docs/decisions/0001-model-nice-levels.md),
is scaled by ``model_slowdown``, the same factor as that niced work feels it
(docs/decisions/0055-model-waits-scaled-for-the-niced-share.md).
"""

from __future__ import annotations

import asyncio
import math
import os
import time
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, TypeVar

SLOWDOWN_VARIABLE = "ZEROSERVE_TEST_SLOWDOWN"
# The factor read from the load is at most this: past it a bound is so long that a hang
# would hold the run for many minutes, and the runner should say the factor itself.
LOAD_SLOWDOWN_CAP = 8.0
# The kernel's scheduler weight of a nice-0 thread; each nice level down divides it by about
# 1.25 (the kernel's sched_prio_to_weight table: 1024 at nice 0, 110 at nice 10).
NICE_0_WEIGHT = 1024.0
NICE_STEP = 1.25
# The nice levels the servers tests start put model work below the loop (``--model-nice``'s
# default, docs/decisions/0001-model-nice-levels.md).
MODEL_NICE = 10
# ``model_slowdown`` is at most this: the niced share beside a busy machine can fall to a
# thirtieth (decision 0055 measured 31x), and a hang should still fail within minutes.
MODEL_SLOWDOWN_CAP = 32.0
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


def slowdown_for_load(load: float, cpus: int) -> float:
    """The factor for a machine whose run queue already holds ``load`` on ``cpus`` cores.

    The suite's processes share the cores with that load, so each gets about
    ``cpus / (cpus + load)`` of the time it would get alone: the factor is the inverse,
    rounded up to a tenth and kept within 1 and ``LOAD_SLOWDOWN_CAP``.
    """
    if cpus < 1 or not load >= 0:
        raise ValueError(f"no slowdown for a load of {load!r} on {cpus!r} cores")
    factor = math.ceil(10 * (cpus + load) / cpus) / 10
    return min(max(factor, 1.0), LOAD_SLOWDOWN_CAP)


def machine_slowdown() -> float:
    """The factor for this machine now, from its one-minute load average."""
    return slowdown_for_load(os.getloadavg()[0], os.cpu_count() or 1)


def slowdown_at_nice(factor: float, nice: int) -> float:
    """The factor a thread ``nice`` levels below the suite feels where the suite feels ``factor``.

    ``factor`` says each core also runs ``factor - 1`` busy nice-0 threads' worth of other
    work; the scheduler gives a thread of weight ``w`` beside them ``w / (w + (factor - 1) *
    1024)`` of the core, so its factor is the inverse: ``1 + (factor - 1) * 1024 / w``,
    rounded up to a tenth, kept within ``factor`` and ``MODEL_SLOWDOWN_CAP`` (never below
    ``factor`` itself).
    """
    if nice < 0:
        raise ValueError(f"no slowdown for nice {nice!r}: model work runs at or below the loop")
    weight = NICE_0_WEIGHT / NICE_STEP**nice
    niced = math.ceil(10 * (1 + (factor - 1) * NICE_0_WEIGHT / weight)) / 10
    return max(factor, min(niced, MODEL_SLOWDOWN_CAP))


def model_slowdown() -> float:
    """The factor for waits on model work (llama.cpp's decode), which runs ``MODEL_NICE``
    levels below the loop: on a busy machine it slows far more than the suite's own
    processes (docs/decisions/0055-model-waits-scaled-for-the-niced-share.md)."""
    return slowdown_at_nice(slowdown(), MODEL_NICE)


def scaled(seconds: float) -> float:
    """A wait of ``seconds`` on a quiet machine, scaled by the suite's slowdown factor."""
    return seconds * slowdown()


def model_scaled(seconds: float) -> float:
    """A wait of ``seconds`` on a quiet machine for niced model work (``model_slowdown``)."""
    return seconds * model_slowdown()


def wait_until(
    predicate: Callable[[], T],
    timeout: float,
    what: str,
    interval: float = 0.01,
    *,
    model: bool = False,
) -> T:
    """Poll ``predicate`` until it returns a truthy value; fail naming ``what`` after ``timeout``.

    ``timeout`` is scaled here, so callers pass the quiet-machine figure; ``model=True``
    says the wait is on niced model work (``model_scaled``).
    """
    bound = model_scaled(timeout) if model else scaled(timeout)
    deadline = time.monotonic() + bound
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {bound:.1f}s waiting for {what}")
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
