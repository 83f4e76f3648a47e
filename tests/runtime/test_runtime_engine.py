"""The shared engine suite: every test runs on inline, thread and process executors, on
asyncio and uvloop."""

from __future__ import annotations

import asyncio
import gc
from typing import Any

import numpy as np
import pytest

from tests.runtime.helpers import counter, engine, flag, until
from tests.support.models.engine import (
    AsyncCounter,
    BatchProbe,
    BrokenLoad,
    Counter,
    Echo,
    Faulty,
    Finisher,
    Flood,
    Gate,
)
from zeroserve import errors, metrics
from zeroserve.models.base import GenerateRequest
from zeroserve.runtime import InferResult, ManualClock, ModelLoadError, StreamAborted


async def infer(eng: Any, name: str, inputs: Any, **kw: Any) -> InferResult:
    h = eng.model(name)
    result: InferResult = await h.infer(h.admit(), inputs, **kw)
    return result


def test_echo_concurrent_results_return_to_their_requests(
    run: Any, executor: str, arena: Any
) -> None:
    async def main() -> None:
        async with engine(executor, {"echo": {"factory": Echo}}, arena=arena) as eng:
            assert eng.ready() and eng.names() == ["echo"]
            h = eng.model("echo")
            assert h.capabilities == frozenset({"infer", "generate", "embed"})
            inputs = [{"x": np.full(100 + i, i, dtype=np.int32)} for i in range(40)]
            results = await asyncio.gather(*(infer(eng, "echo", x) for x in inputs))
            for i, r in enumerate(results):
                assert r.outputs["x"].dtype == np.int32
                assert r.outputs["x"].shape == (100 + i,)
                assert (r.outputs["x"] == i).all()
                r.release()
            assert eng.statistics().models["echo"].queue.in_flight == 0

    run(main())


def test_bytes_tensor_round_trip(run: Any, executor: str, arena: Any) -> None:
    async def main() -> None:
        async with engine(executor, {"echo": {"factory": Echo}}, arena=arena) as eng:
            words = np.array([b"alpha", b"", b"\x00\xffgamma"], dtype=object)
            r = await infer(eng, "echo", {"INPUT0": words})
            assert list(r.outputs["INPUT0"]) == list(words)
            r.release()

    run(main())


def test_generate_embed_and_capabilities(run: Any, executor: str, arena: Any) -> None:
    async def main() -> None:
        models = {"echo": {"factory": Echo}, "probe": {"factory": BatchProbe}}
        async with engine(executor, models, arena=arena) as eng:
            h = eng.model("echo")
            stream = h.generate(h.admit(), GenerateRequest(prompt="a b c", max_tokens=7))
            pieces = [p async for p in stream]
            assert "".join(pieces) == "a b c a b c a"
            vecs = await asyncio.gather(
                *(h.embed(h.admit(), [f"t{i}", "shared"]) for i in range(5))
            )
            ref = Echo().embed(["t3", "shared"])
            assert vecs[3].dtype == np.float32 and np.allclose(vecs[3], ref)
            p = eng.model("probe")
            with pytest.raises(errors.CapabilityError):
                p.generate(p.admit(), GenerateRequest(prompt="x"))
            with pytest.raises(errors.ModelNotFound):
                eng.model("nope")
            assert p.statistics().queue.in_flight == 0

    run(main())


def test_streams_leave_no_cyclic_garbage(run: Any, executor: str, arena: Any) -> None:
    """A stream that ends, and one its consumer leaves, are freed by reference counting:
    none of their objects waits for the cyclic GC (a channel's producer hooks, which hold
    the channel, are dropped when it closes; docs/decisions/0010-memory-between-requests.md)."""

    async def main() -> None:
        async with engine(executor, {"echo": {"factory": Echo}}, arena=arena) as eng:
            h = eng.model("echo")
            for _ in range(3):  # warm: whatever the first streams set up once
                assert [p async for p in h.generate(h.admit(), GenerateRequest(prompt="a b"))]
            gc.collect()
            gc.disable()
            gc.set_debug(gc.DEBUG_SAVEALL)
            try:
                for _ in range(5):
                    whole = h.generate(h.admit(), GenerateRequest(prompt="a b c", max_tokens=40))
                    assert len([p async for p in whole]) == 40
                    left = h.generate(h.admit(), GenerateRequest(prompt="x y", max_tokens=1000))
                    assert await left.__anext__() == "x"
                    await left.aclose()
                await until(lambda: h.statistics().queue.in_flight == 0, "the streams to end")
                gc.collect()
                ours = [o for o in gc.garbage if type(o).__module__.startswith("zeroserve")]
            finally:
                gc.set_debug(0)
                gc.garbage.clear()
                gc.enable()
            assert not ours, sorted({type(o).__qualname__ for o in ours})

    run(main())


def test_stream_reports_the_generators_finish_reason(run: Any, executor: str, arena: Any) -> None:
    async def main() -> None:
        async with engine(executor, {"f": {"factory": Finisher}}, arena=arena) as eng:
            h = eng.model("f")
            for max_tokens, pieces, reason in (
                (None, ["a", "b", "c"], "stop"),
                (2, ["a", "b"], "length"),
            ):
                stream = h.generate(
                    h.admit(), GenerateRequest(prompt="a b c", max_tokens=max_tokens)
                )
                assert [p async for p in stream] == pieces
                assert stream.finish_reason == reason

    run(main())


def test_receive_batch_nowait_takes_what_is_ready(run: Any, executor: str, arena: Any) -> None:
    async def main() -> None:
        async with engine(executor, {"echo": {"factory": Echo}}, arena=arena) as eng:
            h = eng.model("echo")
            stream = h.generate(h.admit(), GenerateRequest(prompt="a b c d e", max_tokens=5))
            got = [await stream.__anext__()]
            batches = []
            while True:
                batch = stream.receive_batch_nowait(64)
                batches.append(len(batch))
                got += batch
                try:
                    got.append(await stream.__anext__())
                except StopAsyncIteration:
                    break
            assert "".join(got) == "a b c d e"
            if executor == "inline":  # pulled: everything left comes in one batch
                assert batches[0] == 4

    run(main())


def test_model_error_fails_only_that_request(run: Any, executor: str, arena: Any) -> None:
    async def main() -> None:
        async with engine(executor, {"f": {"factory": Faulty}}, arena=arena) as eng:
            with pytest.raises(errors.WorkerError, match="ValueError") as info:
                await infer(eng, "f", {"boom": np.zeros(1)})
            # The model's own text may quote the input: it goes to the log, not the client.
            assert "boom requested" not in info.value.message
            ok = await infer(eng, "f", {"x": np.arange(3)})
            assert list(ok.outputs["x"]) == [0, 1, 2]
            ok.release()
            h = eng.model("f")
            pieces = []
            with pytest.raises(errors.WorkerError, match="ValueError"):
                async for piece in h.generate(h.admit(), GenerateRequest(prompt="x")):
                    pieces.append(piece)
            assert pieces == ["one"]

    run(main())


def test_load_failure_raises_model_load_error(run: Any, executor: str, arena: Any) -> None:
    async def main() -> None:
        eng = engine(executor, {"bad": {"factory": BrokenLoad}}, arena=arena)
        with pytest.raises(ModelLoadError, match=r"'bad'.*weights file is missing"):
            await eng.start()
        await eng.aclose()

    run(main())


def test_batching_with_injected_clock(run: Any, executor: str, arena: Any) -> None:
    async def main() -> None:
        clock = ManualClock()
        cfg = {"probe": {"factory": BatchProbe, "max_batch_size": 4, "max_batch_delay_ms": 10}}
        async with engine(executor, cfg, arena=arena, clock=clock) as eng:
            h = eng.model("probe")
            tasks = [
                asyncio.ensure_future(infer(eng, "probe", {"x": np.array([i])})) for i in range(3)
            ]
            await until(lambda: h.statistics().infer_batches.queued == 3, "3 queued")
            await asyncio.sleep(0)
            assert not any(t.done() for t in tasks)  # waiting for the batch delay
            clock.advance(0.011)
            results = await asyncio.gather(*tasks)
            for i, r in enumerate(results):
                assert int(r.outputs["y"][0]) == 2 * i
                assert int(r.outputs["batch"][0]) == 3
                r.release()
            # A full batch goes at once, with no clock movement; a bad request in it
            # fails alone.
            inputs: list[Any] = [{"x": np.array([i])} for i in range(4)]
            inputs[1] = ["not", "a", "mapping"]
            out = await asyncio.gather(
                *(infer(eng, "probe", x) for x in inputs), return_exceptions=True
            )
            assert isinstance(out[1], errors.RequestError)
            for i in (0, 2, 3):
                assert int(out[i].outputs["y"][0]) == 2 * i
                assert int(out[i].outputs["batch"][0]) == 3
                out[i].release()
            stats = h.statistics().infer_batches
            assert stats.batches == 2 and stats.batched_requests == 7

    run(main())


def _gate_models() -> tuple[dict[str, Any], Any, Any, Any]:
    gate, started, finished = flag(), counter(), counter()
    opts = {"gate": gate, "started": started, "finished": finished}
    return {"gate": {"factory": Gate, "options": opts}}, gate, started, finished


def test_admission_queue_depth_429(run: Any, executor: str, arena: Any) -> None:
    async def main() -> None:
        models, gate, started, _ = _gate_models()
        models["gate"]["queue_depth"] = 2
        async with engine(executor, models, arena=arena) as eng:
            h = eng.model("gate")
            a = asyncio.ensure_future(infer(eng, "gate", {"x": np.zeros(1)}))
            b = asyncio.ensure_future(infer(eng, "gate", {"x": np.ones(1)}))
            await until(lambda: started.value == 1, "first request running")
            with pytest.raises(errors.Overloaded) as info:
                h.admit()
            assert info.value.status == 429 and info.value.retry_after > 0
            assert (b"retry-after", b"1") in info.value.headers
            gate.set()
            for r in await asyncio.gather(a, b):
                r.release()
            ticket = h.admit()
            ticket.release()
            with pytest.raises(AssertionError, match="released twice"):
                ticket.release()  # one owner releases, once: a second release is a bug
            stats = h.statistics().queue
            assert stats.rejected == 1 and stats.completed == 3 and stats.in_flight == 0

    run(main())


def test_arena_bytes_503(run: Any, executor: str, arena: Any) -> None:
    async def main() -> None:
        async with engine(executor, {"echo": {"factory": Echo}}, arena=arena) as eng:
            with pytest.raises(errors.Overloaded) as info:
                eng.check_bytes(arena.budget + 1)
            assert info.value.status == 503
            eng.check_bytes(1024)

    run(main())


def test_deadline_queued_request_never_runs(run: Any, executor: str, arena: Any) -> None:
    async def main() -> None:
        clock = ManualClock()
        models, gate, started, finished = _gate_models()
        async with engine(executor, models, arena=arena, clock=clock) as eng:
            a = asyncio.ensure_future(infer(eng, "gate", {"x": np.zeros(1)}))
            await until(lambda: started.value == 1, "first request running")
            b = asyncio.ensure_future(infer(eng, "gate", {"x": np.ones(1)}, deadline=clock() + 1))
            h = eng.model("gate")
            await until(lambda: h.statistics().infer_batches.queued == 1, "second queued")
            clock.advance(2)
            with pytest.raises(errors.DeadlineExceeded, match="queued") as info:
                await b
            assert info.value.status == 504
            gate.set()
            (await a).release()
            assert started.value == 1 and finished.value == 1

    run(main())


def test_deadline_running_request(run: Any, executor: str, arena: Any) -> None:
    async def main() -> None:
        clock = ManualClock()
        models, gate, started, _ = _gate_models()
        async with engine(executor, models, arena=arena, clock=clock) as eng:
            a = asyncio.ensure_future(infer(eng, "gate", {"x": np.zeros(1)}, deadline=clock() + 1))
            await until(lambda: started.value == 1, "request running")
            clock.advance(2)
            with pytest.raises(errors.DeadlineExceeded, match="running"):
                await a
            gate.set()
            # The slot comes back: the model still serves.
            (await infer(eng, "gate", {"x": np.ones(1)})).release()
            assert eng.model("gate").statistics().queue.in_flight == 0

    run(main())


def test_deadline_stream(run: Any, executor: str, arena: Any) -> None:
    async def main() -> None:
        clock = ManualClock()
        produced, closed = counter(), flag()
        models = {"c": {"factory": Counter, "options": {"produced": produced, "closed": closed}}}
        async with engine(executor, models, arena=arena, clock=clock) as eng:
            h = eng.model("c")
            stream = h.generate(h.admit(), GenerateRequest(), deadline=clock() + 1)
            assert await stream.__anext__() == "0"
            clock.advance(2)
            with pytest.raises(errors.DeadlineExceeded):
                async for _ in stream:
                    pass
            await until(closed.is_set, "generator closed")
            assert h.statistics().queue.in_flight == 0

    run(main())


def test_cancel_queued_request_is_removed(run: Any, executor: str, arena: Any) -> None:
    async def main() -> None:
        models, gate, started, _finished = _gate_models()
        async with engine(executor, models, arena=arena) as eng:
            h = eng.model("gate")
            a = asyncio.ensure_future(infer(eng, "gate", {"x": np.zeros(1)}))
            await until(lambda: started.value == 1, "first request running")
            b = asyncio.ensure_future(infer(eng, "gate", {"x": np.ones(1)}))
            await until(lambda: h.statistics().infer_batches.queued == 1, "second queued")
            b.cancel()
            with pytest.raises(asyncio.CancelledError):
                await b
            assert h.statistics().infer_batches.queued == 0
            gate.set()
            (await a).release()
            (await infer(eng, "gate", {"x": np.ones(1)})).release()
            assert started.value == 2  # the cancelled request never ran
            assert h.statistics().queue.in_flight == 0

    run(main())


@pytest.mark.parametrize("model", [Counter, AsyncCounter])
@pytest.mark.parametrize("how", ["aclose", "cancel"])
def test_cancel_generation_closes_model(
    run: Any, executor: str, arena: Any, model: Any, how: str
) -> None:
    async def main() -> None:
        produced, closed = counter(), flag()
        models = {"c": {"factory": model, "options": {"produced": produced, "closed": closed}}}
        async with engine(executor, models, arena=arena) as eng:
            h = eng.model("c")
            stream = h.generate(h.admit(), GenerateRequest())
            if how == "aclose":
                got = [await stream.__anext__() for _ in range(3)]
                assert got == ["0", "1", "2"]
                await stream.aclose()
                await until(closed.is_set, "generator closed")
                # The model stopped: bounded by what the channel could hold ahead of us.
                assert produced.value <= 3 + 8 + 1
            else:  # the consuming task is cancelled (client disconnect)
                got = []

                async def consume() -> None:
                    async for piece in stream:
                        got.append(piece)

                task = asyncio.ensure_future(consume())
                await until(lambda: len(got) >= 3, "three pieces")
                task.cancel()
                with pytest.raises(asyncio.CancelledError):
                    await task
                await until(closed.is_set, "generator closed")
                assert got[:3] == ["0", "1", "2"]
            assert h.statistics().queue.in_flight == 0

    run(main())


def test_slow_consumer_block_policy_bounds_producer(run: Any, executor: str, arena: Any) -> None:
    async def main() -> None:
        produced, closed = counter(), flag()
        models = {"c": {"factory": Counter, "options": {"produced": produced, "closed": closed}}}
        async with engine(executor, models, arena=arena, channel_capacity=4) as eng:
            h = eng.model("c")
            stream = h.generate(h.admit(), GenerateRequest())
            for _ in range(2):
                await stream.__anext__()
            if executor == "inline":
                # A sync generator on the loop is pulled by its consumer: nothing is
                # produced ahead of what was taken, not even the channel's worth.
                for _ in range(20):
                    await asyncio.sleep(0)
                stats = stream.statistics()
                assert stats.pending == 0 and stats.peak_pending <= 1
                assert produced.value == 2
            else:
                await until(lambda: stream.statistics().pending == 4, "channel full")
                for _ in range(20):  # let the producer run ahead if it could
                    await asyncio.sleep(0)
                stats = stream.statistics()
                assert stats.pending == 4 and stats.peak_pending == 4
                # At most what was consumed, the channel, and one in hand.
                assert produced.value <= 2 + 4 + 1
            await stream.aclose()
            await until(closed.is_set, "generator closed")

    run(main())


def test_slow_consumer_coalesce_policy_aborts_past_byte_cap(
    run: Any, executor: str, arena: Any
) -> None:
    async def main() -> None:
        models = {"flood": {"factory": Flood}}
        cap = 64 * 1024
        async with engine(executor, models, arena=arena, coalesce_cap_bytes=cap) as eng:
            h = eng.model("flood")
            stream = h.generate(h.admit(), GenerateRequest(), policy="coalesce")
            first = await stream.__anext__()
            assert first.startswith("x")
            # A reader that takes nothing more: the producer is never stalled, pending
            # text is merged, and past the cap the stream is aborted.
            await until(lambda: stream.statistics().closed, "stream aborted")
            with pytest.raises(StreamAborted):
                async for _ in stream:
                    pass
            stats = stream.statistics()
            assert stats.peak_pending <= 8
            assert stats.peak_pending_bytes <= cap + 1024
            assert stats.coalesced > 0
            assert h.statistics().queue.in_flight == 0

    run(main())


def test_statistics_are_published(run: Any, executor: str, arena: Any) -> None:
    async def main() -> None:
        async with engine(executor, {"echo": {"factory": Echo}}, arena=arena) as eng:
            (await infer(eng, "echo", {"x": np.zeros(4)})).release()
            text = metrics.exposition().decode()
            assert 'zeroserve_queue_completed_total{name="echo"} 1.0' in text
            assert "zeroserve_arena_budget_bytes" in text
            assert 'zeroserve_workers_ready{name="echo"}' in text
            s = eng.statistics()
            assert s.ready and s.arena.leases == 0

    run(main())
