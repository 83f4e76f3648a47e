"""Fixtures of the gateway suite: every async test runs on asyncio and on uvloop."""

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


@pytest.fixture(params=list(LOOPS))
def run(request: pytest.FixtureRequest) -> Iterator[Runner[Any]]:
    with asyncio.Runner(loop_factory=LOOPS[request.param]) as runner:

        def go(coro: Coroutine[Any, Any, T]) -> T:
            return runner.run(asyncio.wait_for(coro, TEST_TIMEOUT_S))

        yield go
