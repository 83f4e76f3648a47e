"""``SlicedSteps``: a sync generator stepped in slices on a pool thread, under credit.

The pool counts its calls: with the clock frozen, one pool call steps as many pieces as
the stream has credit for; with a clock that passes the slice at every step, each call
steps one piece. The clock is injected, so nothing here depends on timing."""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import pytest

from zeroserve.runtime.stepping import (
    STEP_SLICE_S,
    STOPPED,
    SlicedSteps,
    StreamCredit,
    ThreadStepper,
)


class CountingPool(ThreadPoolExecutor):
    def __init__(self) -> None:
        super().__init__(2)
        self.calls = 0

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Future[Any]:
        self.calls += 1
        return super().submit(fn, *args, **kwargs)


def pieces(n: int, result: str = "length") -> Iterator[str]:
    for i in range(n):
        yield f"t{i}"
    return result


async def drain(steps: SlicedSteps, credit: StreamCredit) -> tuple[list[Any], Any]:
    """Take every batch, returning each batch's credit as a consumer would."""
    got: list[Any] = []
    while True:
        batch, end = await steps.take()
        got += batch
        credit.add(len(batch))
        if end is not None:
            return got, end


def test_one_pool_call_steps_as_far_as_the_credit_goes(run: Any) -> None:
    pool = CountingPool()

    async def main() -> None:
        credit = StreamCredit(64)
        steps = SlicedSteps(pieces(50), pool, credit, lambda: False, clock=lambda: 0.0)
        got, end = await drain(steps, credit)
        await steps.aclose()
        assert got == [f"t{i}" for i in range(50)]
        assert end is ThreadStepper.END and steps.result == "length"

    try:
        run(main())
    finally:
        pool.shutdown()
    assert pool.calls == 2  # the 50 steps and the end in one call; then the close


def test_a_slice_ends_a_pool_call_after_its_step(run: Any) -> None:
    pool = CountingPool()
    ticks = itertools.count()

    async def main() -> None:
        credit = StreamCredit(64)
        # Every reading of the clock is one slice later than the last.
        clock = lambda: next(ticks) * STEP_SLICE_S  # noqa: E731
        steps = SlicedSteps(pieces(5), pool, credit, lambda: False, clock=clock)
        got, end = await drain(steps, credit)
        await steps.aclose()
        assert got == [f"t{i}" for i in range(5)] and end is ThreadStepper.END

    try:
        run(main())
    finally:
        pool.shutdown()
    assert pool.calls == 5 + 1 + 1  # a call per piece, one that meets the end, the close


def test_no_credit_no_step_and_a_stop_ends_the_stream(run: Any) -> None:
    pool = CountingPool()
    stepped: list[int] = []

    def counted() -> Iterator[str]:
        for i in itertools.count():
            stepped.append(i)
            yield f"t{i}"

    async def main() -> None:
        credit = StreamCredit(3)
        stop = [False]
        steps = SlicedSteps(counted(), pool, credit, lambda: stop[0], clock=lambda: 0.0)
        got: list[Any] = []
        while len(got) < 3:
            batch, end = await steps.take()
            assert end is None
            got += batch
        assert got == ["t0", "t1", "t2"]
        stop[0] = True
        credit.add(1)  # wakes the pump, which sees the stop before stepping
        batch, end = await steps.take()
        assert batch == [] and end is STOPPED
        await steps.aclose()

    try:
        run(main())
    finally:
        pool.shutdown()
    assert stepped == [0, 1, 2]  # never a step beyond the credit


def test_the_models_exception_ends_the_stream_after_its_pieces(run: Any) -> None:
    pool = CountingPool()

    def failing() -> Iterator[str]:
        yield "a"
        yield "b"
        raise ValueError("model broke")

    async def main() -> None:
        credit = StreamCredit(8)
        steps = SlicedSteps(failing(), pool, credit, lambda: False, clock=lambda: 0.0)
        got, end = await drain(steps, credit)
        await steps.aclose()
        assert got == ["a", "b"]
        assert isinstance(end, ValueError)
        with pytest.raises(ValueError, match="model broke"):
            raise end

    try:
        run(main())
    finally:
        pool.shutdown()
