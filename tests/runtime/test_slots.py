"""The slots of an engine that schedules its own work (``runtime/slots.py``), with a
blocking engine call in real threads: the stream contract (one ticket, released once),
the slot wait, the deadline, a consumer that leaves, the byte cap, and whole calls run
one after another in one slot. On asyncio and uvloop; time is a ``ManualClock``."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from typing import Any

import pytest

from tests.runtime.helpers import WAIT_S, until
from zeroserve.errors import DeadlineExceeded, StreamAborted
from zeroserve.runtime import ManualClock, SlotPool
from zeroserve.runtime.admission import Admission


class FakeEngine:
    """A blocking engine call: it sends the chunks it is given, each once the test lets
    it go (``step``), and records what its callback answered."""

    def __init__(self) -> None:
        self._go = threading.Semaphore(0)
        self.answers: list[bool] = []
        self.returned = threading.Event()
        self.started = threading.Event()

    def step(self) -> None:
        self._go.release()

    def call(self, chunks: list[bytes]) -> Callable[[bytes, Callable[[bytes], bool]], None]:
        def run(payload: bytes, callback: Callable[[bytes], bool]) -> None:
            self.started.set()
            try:
                for chunk in chunks:
                    assert self._go.acquire(timeout=WAIT_S), "the test never let it go"
                    stop = callback(payload + chunk)
                    self.answers.append(stop)
                    if stop:
                        return
            finally:
                self.returned.set()

        return run


def _pool(slots: int = 1, byte_cap: int = 1 << 20) -> tuple[SlotPool, Admission, ManualClock]:
    clock = ManualClock()
    return SlotPool("m", slots, byte_cap=byte_cap, clock=clock), Admission("m", 8, clock), clock


def test_a_stream_reads_every_chunk_and_releases_its_ticket_and_slot(run: Any) -> None:
    async def main() -> None:
        pool, adm, _ = _pool()
        engine = FakeEngine()
        for _ in range(3):
            engine.step()
        stream = pool.stream(adm.admit(), engine.call([b"1", b"2", b"3"]), b"x", deadline=2000.0)
        got = [chunk async for chunk in stream]
        assert got == [b"x1", b"x2", b"x3"]
        assert stream.complete and adm.statistics().in_flight == 0
        await until(lambda: pool.statistics().active == 0, "the slot released")
        await stream.aclose()  # a second close is a no-op: the ticket was released once
        assert pool.statistics().aborted == 0 and pool.statistics().requests == 1
        pool.close()

    run(main())


def test_a_request_waits_for_a_free_slot_on_the_loop(run: Any) -> None:
    async def main() -> None:
        pool, adm, _ = _pool(slots=1)
        first, second = FakeEngine(), FakeEngine()
        a = pool.stream(adm.admit(), first.call([b"a"]), b"", deadline=2000.0)
        b = pool.stream(adm.admit(), second.call([b"b"]), b"", deadline=2000.0)
        a_next = asyncio.ensure_future(a.__anext__())
        await until(first.started.is_set, "the first call started")
        b_next = asyncio.ensure_future(b.__anext__())
        await until(lambda: pool.statistics().queued == 1, "the second waiting for the slot")
        assert not second.started.is_set()
        first.step()
        assert await a_next == b"a"
        with pytest.raises(StopAsyncIteration):
            await a.__anext__()
        second.step()
        assert await b_next == b"b"
        await b.aclose()
        assert adm.statistics().in_flight == 0
        pool.close()

    run(main())


def test_the_deadline_ends_a_wait_for_a_slot(run: Any) -> None:
    async def main() -> None:
        pool, adm, clock = _pool(slots=1)
        busy = FakeEngine()
        a = pool.stream(adm.admit(), busy.call([b"a"]), b"", deadline=2000.0)
        a_next = asyncio.ensure_future(a.__anext__())
        await until(busy.started.is_set, "the first call started")
        b = pool.stream(adm.admit(), FakeEngine().call([b"b"]), b"", deadline=1010.0)
        b_next = asyncio.ensure_future(b.__anext__())
        await until(lambda: pool.statistics().queued == 1, "the second waiting")
        clock.advance(11)
        with pytest.raises(DeadlineExceeded):
            await b_next
        assert adm.statistics().in_flight == 1 and pool.statistics().queued == 0
        busy.step()
        assert await a_next == b"a"
        await a.aclose()
        await until(lambda: pool.statistics().active == 0, "the slot released")
        pool.close()

    run(main())


def test_the_deadline_stops_a_running_call_at_its_next_chunk(run: Any) -> None:
    async def main() -> None:
        pool, adm, clock = _pool()
        engine = FakeEngine()
        engine.step()
        stream = pool.stream(adm.admit(), engine.call([b"1", b"2"]), b"", deadline=1005.0)
        assert await stream.__anext__() == b"1"
        clock.advance(6)
        with pytest.raises(DeadlineExceeded):
            await stream.__anext__()
        assert adm.statistics().in_flight == 0
        engine.step()  # the engine's next chunk is answered "stop"
        await until(engine.returned.is_set, "the call returned")
        await until(lambda: pool.statistics().active == 0, "the slot released")
        assert engine.answers == [False, True]
        assert pool.statistics().aborted == 1
        pool.close()

    run(main())


def test_a_consumer_that_leaves_stops_the_call(run: Any) -> None:
    async def main() -> None:
        pool, adm, _ = _pool()
        engine = FakeEngine()
        engine.step()
        stream = pool.stream(adm.admit(), engine.call([b"1", b"2"]), b"", deadline=2000.0)
        assert await stream.__anext__() == b"1"
        waiting = asyncio.ensure_future(stream.__anext__())
        await asyncio.sleep(0)
        waiting.cancel()  # the client went away while the stream waited
        with pytest.raises(asyncio.CancelledError):
            await waiting
        assert adm.statistics().in_flight == 0
        engine.step()
        await until(engine.returned.is_set, "the call returned")
        assert engine.answers == [False, True]
        await until(lambda: pool.statistics().active == 0, "the slot released")
        pool.close()

    run(main())


def test_a_reader_past_the_byte_cap_is_aborted(run: Any) -> None:
    async def main() -> None:
        pool, adm, _ = _pool(byte_cap=10)
        engine = FakeEngine()
        engine.step()
        stream = pool.stream(adm.admit(), engine.call([b"abcd"] * 4), b"", deadline=2000.0)
        first = await stream.__anext__()
        for _ in range(3):  # 12 bytes pending: past the cap
            engine.step()
        await until(engine.returned.is_set, "the call returned")
        assert engine.answers[-1] is True  # stopped by the cap
        with pytest.raises(StreamAborted):
            for _ in range(4):
                await stream.__anext__()
        assert first == b"abcd" and adm.statistics().in_flight == 0
        pool.close()

    run(main())


def test_an_engine_error_comes_after_the_chunks_before_it(run: Any) -> None:
    async def main() -> None:
        pool, adm, _ = _pool()

        def failing(payload: bytes, callback: Callable[[bytes], bool]) -> None:
            callback(b"ok")
            raise ValueError("the engine refused")

        stream = pool.stream(adm.admit(), failing, b"", deadline=2000.0)
        assert await stream.__anext__() == b"ok"
        with pytest.raises(ValueError):
            await stream.__anext__()
        assert adm.statistics().in_flight == 0
        await until(lambda: pool.statistics().active == 0, "the slot released")
        pool.close()

    run(main())


def test_ready_chunks_are_taken_without_waiting(run: Any) -> None:
    async def main() -> None:
        pool, adm, _ = _pool()
        engine = FakeEngine()
        for _ in range(3):
            engine.step()
        stream = pool.stream(adm.admit(), engine.call([b"1", b"2", b"3"]), b"", deadline=2000.0)
        assert stream.receive_batch_nowait(8) == []  # not started: nothing is there
        assert await stream.__anext__() == b"1"
        await until(engine.returned.is_set, "the call returned")
        assert stream.receive_batch_nowait(8) == [b"2", b"3"]
        with pytest.raises(StopAsyncIteration):
            await stream.__anext__()
        pool.close()

    run(main())


def test_whole_calls_run_one_after_another_in_one_slot(run: Any) -> None:
    async def main() -> None:
        pool, adm, _ = _pool(slots=2)
        seen: list[str] = []

        def call(name: str) -> Callable[[], str]:
            def go() -> str:
                seen.append(name)
                return name.upper()

            return go

        out = await pool.run(adm.admit(), [call("a"), call("b")], deadline=2000.0, items=(8, 3))
        assert out == ["A", "B"] and seen == ["a", "b"]
        stats = pool.statistics()
        assert stats.embedded_inputs == 11 and stats.active == 0
        assert adm.statistics().in_flight == 0

        def refuse() -> str:
            raise ValueError("refused")

        with pytest.raises(ValueError):
            await pool.run(adm.admit(), [refuse, call("never")], deadline=2000.0)
        assert "never" not in seen and adm.statistics().in_flight == 0
        await until(lambda: pool.statistics().active == 0, "the slot released")
        pool.close()

    run(main())


def test_a_deadline_ends_whole_calls_between_two(run: Any) -> None:
    async def main() -> None:
        pool, adm, clock = _pool()
        release = threading.Event()
        ran: list[int] = []

        def slow() -> int:
            release.wait(WAIT_S)
            ran.append(1)
            return 1

        task = asyncio.ensure_future(pool.run(adm.admit(), [slow, slow], deadline=1005.0))
        await until(lambda: pool.statistics().active == 1, "the first call running")
        clock.advance(6)
        with pytest.raises(DeadlineExceeded):
            await task
        assert adm.statistics().in_flight == 0
        assert pool.statistics().active == 1  # the call cannot be stopped: it keeps the slot
        release.set()
        await until(lambda: pool.statistics().active == 0, "the slot released")
        assert ran == [1]  # no second call started
        pool.close()

    run(main())
