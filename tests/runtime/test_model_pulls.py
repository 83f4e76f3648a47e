"""``PullGate`` (runtime/model_pulls.py): callers of one source share its one fetch, at most
``max_pulls`` fetches run at once in threads, and a caller that gives up cancels nothing.
The fetch is a blocking function held by threading events, as a download would be."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path

from tests.support import await_until, run_async
from zeroserve.runtime.model_pulls import PullGate

WAIT_S = 10.0


class _Fetcher:
    """A blocking pull: records each call, then waits for its source's release."""

    def __init__(self) -> None:
        self.calls: list[str] = []
        self.release: dict[str, threading.Event] = {}
        self._lock = threading.Lock()

    def gate(self, source: str) -> threading.Event:
        with self._lock:
            return self.release.setdefault(source, threading.Event())

    def __call__(self, source: str) -> Path:
        with self._lock:
            self.calls.append(source)
        assert self.gate(source).wait(WAIT_S * 6)
        return Path("/cache") / source


def test_one_fetch_per_source_and_at_most_max_pulls_at_once() -> None:
    async def body() -> None:
        fetcher = _Fetcher()
        gate = PullGate(fetcher, max_pulls=1)
        a1 = asyncio.ensure_future(gate.fetch("a"))
        a2 = asyncio.ensure_future(gate.fetch("a"))
        b = asyncio.ensure_future(gate.fetch("b"))

        async def a_running() -> bool:
            return fetcher.calls == ["a"]

        await await_until(a_running, WAIT_S, "the fetch of a")
        stats = gate.statistics()
        assert (stats.running, stats.waiting) == (1, 1)  # b waits for a turn
        a1.cancel()  # a caller giving up cancels nothing for the other
        fetcher.gate("a").set()
        assert await a2 == Path("/cache/a")
        fetcher.gate("b").set()
        assert await b == Path("/cache/b")
        assert fetcher.calls == ["a", "b"]
        assert gate.statistics().running == 0

    run_async(body())


def test_a_failed_fetch_reaches_every_caller_and_the_next_fetch_runs_again() -> None:
    calls: list[str] = []

    def failing(source: str) -> Path:
        calls.append(source)
        raise OSError("the hub hung up")

    async def body() -> None:
        gate = PullGate(failing)
        results = await asyncio.gather(gate.fetch("a"), gate.fetch("a"), return_exceptions=True)
        assert all(isinstance(r, OSError) for r in results)
        (again,) = await asyncio.gather(gate.fetch("a"), return_exceptions=True)
        assert isinstance(again, OSError)

    run_async(body())
    assert calls == ["a", "a"]
