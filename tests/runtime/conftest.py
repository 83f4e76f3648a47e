"""Fixtures of the runtime suite: every test runs on asyncio and on uvloop, and the
shared engine tests run on every executor (one suite, every implementation)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine, Iterator
from typing import Any, TypeVar

import pytest
import uvloop

from tests.support import scaled

T = TypeVar("T")
Runner = Callable[[Coroutine[Any, Any, T]], T]

# A hung test fails after this long instead of hanging the suite.
TEST_TIMEOUT_S = scaled(30.0)

LOOPS = {"asyncio": asyncio.new_event_loop, "uvloop": uvloop.new_event_loop}
EXECUTORS = ["inline", "thread", "process"]


@pytest.fixture(params=list(LOOPS))
def run(request: pytest.FixtureRequest) -> Iterator[Runner[Any]]:
    with asyncio.Runner(loop_factory=LOOPS[request.param]) as runner:

        def go(coro: Coroutine[Any, Any, T]) -> T:
            return runner.run(asyncio.wait_for(coro, TEST_TIMEOUT_S))

        yield go


@pytest.fixture(params=EXECUTORS)
def executor(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def arena() -> Iterator[Any]:
    """A small arena per test; every test must leave it with no live lease."""
    from zeroserve.runtime.arena import Arena

    a = Arena(64 << 20, warm_bytes=1 << 20)
    yield a
    stats = a.statistics()
    a.close()
    assert stats.leases == 0 and stats.used == 0, f"leaked leases: {stats}"
