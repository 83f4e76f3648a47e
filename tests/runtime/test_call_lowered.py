"""``call_lowered`` (runtime/priority.py): a model's load on a thread of its own, lowered.
A caller that gives up (a load timeout, a shutdown) cancels the wait; the load still ends
on its thread, and its outcome must then be dropped quietly, never raised in that thread."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pytest

from tests.support.timing import scaled
from zeroserve.runtime.priority import call_lowered


@pytest.fixture
def thread_errors() -> Any:
    seen: list[BaseException | None] = []
    before = threading.excepthook
    threading.excepthook = lambda args: seen.append(args.exc_value)
    try:
        yield seen
    finally:
        threading.excepthook = before


@pytest.mark.parametrize("outcome", ["returns", "raises"])
def test_a_load_the_caller_gave_up_on_ends_quietly(outcome: str, thread_errors: Any) -> None:
    release = threading.Event()
    finished = threading.Event()

    def load() -> str:
        try:
            release.wait(scaled(30))
            if outcome == "raises":
                raise ConnectionResetError("the engine's side port closed")
            return "loaded"
        finally:
            finished.set()

    async def give_up() -> None:
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(call_lowered(load, 0), 0.01)

    asyncio.run(give_up())
    release.set()
    assert finished.wait(scaled(30))
    for t in threading.enumerate():
        if t.name == "zeroserve-model-load":
            t.join(scaled(30))
    assert thread_errors == []


def test_a_load_returns_or_raises_to_its_caller() -> None:
    assert asyncio.run(call_lowered(lambda: 7, 0)) == 7

    def fails() -> None:
        raise ValueError("bad gguf")

    with pytest.raises(ValueError, match="bad gguf"):
        asyncio.run(call_lowered(fails, 0))
