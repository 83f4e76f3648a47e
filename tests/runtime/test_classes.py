"""Priority classes (``runtime/classes.py``): the class queue's order, its aging and its
starvation bound on an injected clock; then the same order where requests really wait,
a batcher's queue on every executor and an engine's slots, with models whose progress
the test controls. No sleeping, no timing asserted."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from typing import Any

import msgspec
import numpy as np
import pytest

from tests.runtime.helpers import CTX, counter, engine, until
from tests.support.models.engine import Turnstile, TurnstileEmbedder
from zeroserve import metrics
from zeroserve.runtime import ManualClock, SlotPool
from zeroserve.runtime.admission import Admission
from zeroserve.runtime.classes import (
    BATCH_PRIORITY,
    DEFAULT_AGING_S,
    DEFAULT_PRIORITY,
    MAX_PRIORITY,
    MIN_PRIORITY,
    ClassQueue,
    check_priority,
    pass_over_bound_s,
)

# -- the queue ---------------------------------------------------------------------------


def test_a_lower_class_is_served_first_and_a_class_is_first_come_first_served() -> None:
    clock = ManualClock()
    q: ClassQueue[str] = ClassQueue(clock)
    q.push("low-1", 5)
    clock.advance(0.1)
    q.push("low-2", 5)
    clock.advance(0.1)
    q.push("high-1", 0)
    clock.advance(0.1)
    q.push("high-2", 0)
    q.push("top", -3)
    assert list(q) == ["top", "high-1", "high-2", "low-1", "low-2"]
    assert q.take(2) == ["top", "high-1"]
    assert q.pop() == "high-2" and len(q) == 2


def test_a_waiting_request_rises_one_class_per_aging_step() -> None:
    clock = ManualClock()
    q: ClassQueue[str] = ClassQueue(clock, aging_s=1.0)
    q.push("low", 3)
    clock.advance(2.9)  # aged to class 0.1: a class-0 newcomer still goes first
    q.push("early-high", 0)
    clock.advance(0.2)  # the low request's effective class is now below 0
    q.push("late-high", 0)
    assert list(q) == ["early-high", "low", "late-high"]


def test_aging_zero_is_first_come_first_served_whatever_the_class() -> None:
    clock = ManualClock()
    q: ClassQueue[str] = ClassQueue(clock, aging_s=0.0)
    for name, cls in (("a", 9), ("b", -9), ("c", 0)):
        q.push(name, cls)
        clock.advance(0.01)
    assert q.take(3) == ["a", "b", "c"]


def test_the_starvation_bound_under_continuous_high_class_load() -> None:
    """A low-class request under a saturating stream of high-class ones: one newcomer
    and one start every 0.25 s, forever. It starts, and everything started before it
    arrived before its pass-over bound ran out."""
    clock = ManualClock()
    aging = DEFAULT_AGING_S
    q: ClassQueue[tuple[str, float]] = ClassQueue(clock, aging)
    for _ in range(8):  # a backlog of high-class work already waiting
        q.push(("high", clock()), DEFAULT_PRIORITY)
    arrived = clock()
    q.push(("low", arrived), 7)
    bound = pass_over_bound_s(7, DEFAULT_PRIORITY, aging)
    assert bound == 7 * aging
    started_before: list[float] = []
    for _ in range(10_000):
        clock.advance(0.25)
        q.push(("high", clock()), DEFAULT_PRIORITY)
        name, when = q.pop()
        if name == "low":
            break
        started_before.append(when)
    else:
        raise AssertionError("the low-class request never started")
    assert max(started_before) <= arrived + bound
    # It was passed over by newcomers, and by nothing that came after its bound.
    assert any(w > arrived for w in started_before)


def test_the_batch_class_is_the_lowest_and_classes_are_bounded() -> None:
    assert BATCH_PRIORITY == MAX_PRIORITY > DEFAULT_PRIORITY > MIN_PRIORITY
    assert check_priority(BATCH_PRIORITY) == BATCH_PRIORITY
    for bad in (MAX_PRIORITY + 1, MIN_PRIORITY - 1):
        with pytest.raises(ValueError, match="between -1000 and 1000"):
            check_priority(bad)
    with pytest.raises(ValueError, match="integer"):
        check_priority(True)


def test_statistics_per_class() -> None:
    clock = ManualClock()
    q: ClassQueue[str] = ClassQueue(clock)
    q.push("a", 0)
    q.push("b", 4)
    q.push("c", 4)
    clock.advance(2.0)
    assert q.pop() == "a"
    assert q.remove("c") and not q.remove("c")
    clock.advance(1.0)
    stats = q.statistics()
    assert stats[0].waiting == 0 and stats[0].started == 1 and stats[0].waited_s == 2.0
    assert stats[4].waiting == 1 and stats[4].longest_wait_s == 3.0 and stats[4].started == 0


# -- a batcher's queue, on every executor ------------------------------------------------


def _turnstile() -> tuple[dict[str, Any], Any, Any, Any]:
    order, seen, passed = CTX.Array("i", 16), counter(), counter()
    opts = {"order": order, "seen": seen, "passed": passed}
    cfg = {"factory": Turnstile, "options": opts, "workers": 1, "max_batch_size": 1}
    return {"turnstile": cfg}, order, seen, passed


def test_a_batcher_serves_a_high_class_before_earlier_low_class_requests(
    run: Any, executor: str, arena: Any
) -> None:
    async def main() -> None:
        models, order, seen, passed = _turnstile()
        clock = ManualClock()
        async with engine(executor, models, arena=arena, clock=clock) as eng:
            h = eng.model("turnstile")

            def send(x: int, priority: int) -> asyncio.Future[Any]:
                ticket = h.admit(priority)
                return asyncio.ensure_future(h.infer(ticket, {"x": np.array([x])}))

            tasks = [send(1, 5)]  # runs at once and holds the only worker
            await until(lambda: seen.value == 1, "the first call running")
            tasks += [send(2, 5), send(3, 5)]
            await until(lambda: h.statistics().infer_batches.queued == 2, "two low waiting")
            tasks.append(send(4, 0))
            await until(lambda: h.statistics().infer_batches.queued == 3, "the high waiting")
            for n in range(1, 5):  # let call n end; the next one starts
                passed.value = n
                await until(lambda n=n: seen.value >= min(n + 1, 4), f"call {n + 1} started")
            for r in await asyncio.gather(*tasks):
                r.release()
            assert list(order[:4]) == [1, 4, 2, 3]
            waits = eng._models["turnstile"].class_statistics()
            assert waits[0].started == 1 and waits[5].started == 3
            text = metrics.exposition().decode()  # per model and class
            assert 'zeroserve_class_wait_started_total{class="5",name="turnstile"} 3.0' in text
            assert 'zeroserve_class_wait_waiting{class="0",name="turnstile"} 0.0' in text
            assert "zeroserve_class_wait_seconds_total" in text
            msgspec.json.encode(metrics.snapshot())  # /v1/stats: the same, as JSON

    run(main())


# -- the executor's slot, contended by a model's infer and embed batchers ---------------


def _slot_takers(eng: Any, name: str) -> int:
    """Batchers waiting for the model's executor slot now (runtime/waiters.py)."""
    ex = eng._models[name].executor
    waiters = ex._waiters if hasattr(ex, "_waiters") else ex._slots._waiters
    return len(waiters)


async def _contend_for_the_slot(executor: str, arena: Any, **options: Any) -> list[int]:
    """One worker, two batchers: while call 1 holds the worker, the embed batcher asks
    for the slot for a class-5 request (2), then the infer batcher for a class-0 one
    (3). The order the three calls ran in."""
    order, seen, passed = CTX.Array("i", 8), counter(), counter()
    opts = {"order": order, "seen": seen, "passed": passed}
    cfg = {"factory": TurnstileEmbedder, "options": opts, "workers": 1, "max_batch_size": 1}
    clock = ManualClock()
    async with engine(executor, {"te": cfg}, arena=arena, clock=clock, **options) as eng:
        h = eng.model("te")
        first = asyncio.ensure_future(h.infer(h.admit(5), {"x": np.array([1])}))
        await until(lambda: seen.value == 1, "the first call holds the worker")
        clock.advance(0.1)
        low = asyncio.ensure_future(h.embed(h.admit(5), ["2"]))
        await until(lambda: _slot_takers(eng, "te") == 1, "the embed batcher waits")
        clock.advance(0.1)
        high = asyncio.ensure_future(h.infer(h.admit(0), {"x": np.array([3])}))
        await until(lambda: _slot_takers(eng, "te") == 2, "both batchers wait")
        for n in range(1, 4):  # let call n end; the next one starts
            passed.value = n
            await until(lambda n=n: seen.value >= min(n + 1, 3), f"call {n + 1} started")
        for r in (await first, await high):
            r.release()
        assert (await low).shape == (1, 2)
        assert _slot_takers(eng, "te") == 0
        return list(order[:3])


def test_the_executor_slot_goes_to_the_batcher_with_the_best_class(
    run: Any, executor: str, arena: Any
) -> None:
    """The class-0 request runs before the class-5 one whose batcher asked first (first
    come, first served ran the embedding first: the next test)."""
    assert run(_contend_for_the_slot(executor, arena)) == [1, 3, 2]


def test_with_classes_off_the_executor_slot_is_first_come_first_served(
    run: Any, arena: Any
) -> None:
    """``priority_aging_s = 0``: the batcher that asked first gets the slot."""
    assert run(_contend_for_the_slot("thread", arena, priority_aging_s=0.0)) == [1, 2, 3]


# -- an engine's slots ----------------------------------------------------------------------


class _Blocking:
    """A blocking engine call per request that records when it started and ends when the
    test lets it go."""

    def __init__(self) -> None:
        self.started: list[str] = []
        self._lock = threading.Lock()
        self._go: dict[str, threading.Event] = {}

    def call(self, name: str) -> Callable[[bytes, Callable[[bytes], bool]], None]:
        go = self._go[name] = threading.Event()

        def run(payload: bytes, callback: Callable[[bytes], bool]) -> None:
            with self._lock:
                self.started.append(name)
            assert go.wait(30), "the test never let it go"
            callback(name.encode())

        return run

    def finish(self, name: str) -> None:
        self._go[name].set()


def test_engine_slots_go_to_the_best_class_first(run: Any) -> None:
    async def main() -> None:
        clock = ManualClock()
        pool = SlotPool("m", 1, byte_cap=1 << 20, clock=clock)
        adm = Admission("m", 8, clock)
        eng = _Blocking()
        streams = {}
        firsts = {}
        for name, cls in (("a", 3), ("b", 3), ("c", 3), ("urgent", -2)):
            streams[name] = pool.stream(adm.admit(cls), eng.call(name), b"", deadline=2000.0)
            firsts[name] = asyncio.ensure_future(streams[name].__anext__())
            if name == "a":
                await until(lambda: eng.started == ["a"], "a holds the slot")
            clock.advance(0.1)
        await until(lambda: pool.statistics().queued == 3, "three waiting for the slot")
        for name in ("a", "urgent", "b", "c"):
            await until(lambda name=name: eng.started[-1:] == [name], f"{name} started")
            eng.finish(name)
            assert await firsts[name] == name.encode()
            await streams[name].aclose()
        assert eng.started == ["a", "urgent", "b", "c"]
        stats = pool.class_statistics()
        assert stats[-2].started == 1 and stats[3].started == 2  # "a" never waited
        assert adm.statistics().in_flight == 0
        pool.close()

    run(main())


def test_a_cancelled_slot_wait_leaves_its_class_unserved(run: Any) -> None:
    async def main() -> None:
        clock = ManualClock()
        pool = SlotPool("m", 1, byte_cap=1 << 20, clock=clock)
        adm = Admission("m", 8, clock)
        eng = _Blocking()
        a = pool.stream(adm.admit(0), eng.call("a"), b"", deadline=2000.0)
        a_next = asyncio.ensure_future(a.__anext__())
        await until(lambda: eng.started == ["a"], "a holds the slot")
        b = pool.stream(adm.admit(9), eng.call("b"), b"", deadline=2000.0)
        b_next = asyncio.ensure_future(b.__anext__())
        await until(lambda: pool.statistics().queued == 1, "b waiting")
        b_next.cancel()
        with pytest.raises(asyncio.CancelledError):
            await b_next
        assert 9 not in pool.class_statistics()  # neither waiting nor ever started
        eng.finish("a")
        assert await a_next == b"a"
        await a.aclose()
        await until(lambda: pool.statistics().active == 0, "the slot free")
        assert adm.statistics().in_flight == 0
        pool.close()

    run(main())
