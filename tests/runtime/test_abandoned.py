"""Work a client abandons is reclaimed from the moment it is abandoned, not from its
deadline (docs/decisions/0025-abandoned-work-grace-starts-at-abandonment.md).

Every engine here runs on a ``ManualClock`` that never moves and a 300 s deadline: no
deadline fires, so whatever is reclaimed was reclaimed because its caller went away.
Each process model's respawn is held at its load until the test releases it, so the test
sees the model while no worker can take work: not ready, and admission answering 503
with ``Retry-After`` and a reason.
"""

from __future__ import annotations

import asyncio
import os
import threading
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.runtime.helpers import counter, engine
from tests.support import await_until
from tests.support.models.hanging import HangingAsync, HangingThread, HangingWorker
from tests.support.observe import release_fifo
from zeroserve import errors
from zeroserve.models.base import GenerateRequest
from zeroserve.runtime import ManualClock, WorkerStatistics
from zeroserve.runtime.engine import Engine

GRACE_S = 0.2
DEADLINE_S = 300.0
# The longest a test waits for the engine to reach a state (scaled by the suite's factor).
WAIT_S = 20.0


def now(value: object) -> Any:
    """``value`` as an awaitable, for ``await_until``'s predicate (a yield to the loop)."""
    return asyncio.sleep(0, value)


def workers(eng: Engine, name: str) -> WorkerStatistics:
    return eng.model(name).statistics().workers


def fifo(tmp_path: Path, name: str) -> str:
    path = str(tmp_path / f"{name}-hold")
    os.mkfifo(path)
    return path


def hanging_worker(
    tmp_path: Path, name: str, **config: Any
) -> tuple[dict[str, Any], Any, Any, str]:
    """A one-worker process model whose respawn is held: its config, its ``started``
    (calls that began hanging) and ``starts`` (loads) counters, and the hold's FIFO."""
    hung, starts, hold = counter(), counter(), fifo(tmp_path, name)
    options = {"started": hung, "starts": starts, "hold": hold}
    return (
        {"factory": HangingWorker, "workers": 1, "options": options, **config},
        hung,
        starts,
        hold,
    )


def reclaim_engine(executor: str, models: dict[str, Any], arena: Any) -> Engine:
    return engine(
        executor,
        models,
        arena=arena,
        clock=ManualClock(),
        hang_grace_s=GRACE_S,
        default_deadline_s=DEADLINE_S,
    )


async def held_then_served(eng: Engine, name: str, starts: Any, hold: str) -> None:
    """The reclaimed worker's respawn is held: no worker can take work, the model is not
    ready and admission refuses at the head; released, the model serves again."""
    h = eng.model(name)
    await await_until(lambda: now(starts.value == 2), WAIT_S, "the respawn loading")
    assert not eng.ready()
    status = eng.status().models[name]
    assert not status.ready and status.ready_workers == 0
    assert status.reason is not None and "1 of 1 workers restarting" in status.reason
    in_flight = h.statistics().queue.in_flight
    with pytest.raises(errors.WorkerError) as info:
        h.admit()
    assert (info.value.status, info.value.code) == (503, "worker_failed")
    assert (b"retry-after", b"1") in info.value.headers
    assert h.statistics().queue.in_flight == in_flight  # refused at the head: not queued
    await await_until(lambda: now(release_fifo(hold)), WAIT_S, "the respawn reading its hold")
    await await_until(lambda: now(eng.ready()), WAIT_S, "the respawned worker ready")
    assert eng.status().models[name].reason is None
    r = await h.infer(h.admit(), {"x": np.arange(3)})
    assert r.outputs["x"].tolist() == [0, 1, 2]
    r.release()
    stats = workers(eng, name)
    assert (stats.reclaimed, stats.restarts, stats.crashes) == (1, 1, 0)


# -- process -----------------------------------------------------------------------------------
def test_process_call_abandoned_by_its_client_is_reclaimed(
    run: Any, arena: Any, tmp_path: Path
) -> None:
    async def main() -> None:
        model, hung, starts, hold = hanging_worker(tmp_path, "m")
        async with reclaim_engine("process", {"m": model}, arena) as eng:
            h = eng.model("m")
            call = asyncio.ensure_future(h.infer(h.admit(), {"hang": np.zeros(1)}))
            await await_until(lambda: now(hung.value == 1), WAIT_S, "the call hanging")
            call.cancel()  # the client disconnects
            # Within the grace the worker still counts as free: a request now is admitted,
            # queues behind the abandoned call, and is served by the respawned worker.
            queued = asyncio.ensure_future(h.infer(h.admit(), {"x": np.ones(2)}))
            await await_until(
                lambda: now(workers(eng, "m").reclaimed == 1), WAIT_S, "the worker reclaimed"
            )
            assert call.cancelled() and not queued.done()
            await held_then_served(eng, "m", starts, hold)
            r = await queued
            assert r.outputs["x"].tolist() == [1.0, 1.0]
            r.release()

    run(main())


def test_process_stream_abandoned_by_its_client_is_reclaimed(
    run: Any, arena: Any, tmp_path: Path
) -> None:
    async def main() -> None:
        model, hung, starts, hold = hanging_worker(tmp_path, "m")
        async with reclaim_engine("process", {"m": model}, arena) as eng:
            h = eng.model("m")
            stream = h.generate(h.admit(), GenerateRequest(prompt="hang"))
            assert await stream.__anext__() == "first"
            await await_until(lambda: now(hung.value == 1), WAIT_S, "the step hanging")
            await stream.aclose()  # the client disconnects
            await await_until(
                lambda: now(workers(eng, "m").reclaimed == 1), WAIT_S, "the worker reclaimed"
            )
            await held_then_served(eng, "m", starts, hold)
            assert workers(eng, "m").streams == 0

    run(main())


def test_process_batch_serving_a_live_request_is_left_alone(
    run: Any, arena: Any, tmp_path: Path
) -> None:
    """One request of a batch of two goes away: the batch still serves the other, so it is
    not abandoned. Shown without sleeping: work abandoned after it, on another model, is
    reclaimed first (its grace would have ended later)."""

    async def main() -> None:
        batch_model, batch_hung, _, _ = hanging_worker(tmp_path, "batch", max_batch_size=2)
        witness, witness_hung, _, _ = hanging_worker(tmp_path, "witness")
        models = {"batch": batch_model, "witness": witness}
        async with reclaim_engine("process", models, arena) as eng:
            b, w = eng.model("batch"), eng.model("witness")
            # The batch delay runs on the clock that never moves: the batch forms full.
            gone = asyncio.ensure_future(b.infer(b.admit(), {"hang": np.zeros(1)}))
            live = asyncio.ensure_future(b.infer(b.admit(), {"hang": np.ones(1)}))
            await await_until(lambda: now(batch_hung.value == 1), WAIT_S, "the batch hanging")
            gone.cancel()
            other = asyncio.ensure_future(w.infer(w.admit(), {"hang": np.zeros(1)}))
            await await_until(lambda: now(witness_hung.value == 1), WAIT_S, "the witness call")
            other.cancel()
            await await_until(
                lambda: now(workers(eng, "witness").reclaimed == 1), WAIT_S, "the witness reclaimed"
            )
            assert workers(eng, "batch").reclaimed == 0
            assert not live.done()
            live.cancel()  # now nothing is served by the batch: it is reclaimed
            await await_until(
                lambda: now(workers(eng, "batch").reclaimed == 1), WAIT_S, "the batch reclaimed"
            )

    run(main())


# -- thread --------------------------------------------------------------------------------------
def thread_model() -> tuple[dict[str, Any], threading.Event, threading.Event]:
    released, began = threading.Event(), threading.Event()
    options = {"release": released, "started": began}
    return {"factory": HangingThread, "workers": 1, "options": options}, released, began


def test_thread_call_abandoned_by_its_client_counts_stuck_at_once(run: Any, arena: Any) -> None:
    async def main() -> None:
        model, released, began = thread_model()
        async with reclaim_engine("thread", {"t": model}, arena) as eng:
            h = eng.model("t")
            try:
                call = asyncio.ensure_future(h.infer(h.admit(), {"hang": np.zeros(1)}))
                await await_until(lambda: now(began.is_set()), WAIT_S, "the call hanging")
                call.cancel()  # the client disconnects
                await await_until(
                    lambda: now(workers(eng, "t").stuck == 1), WAIT_S, "the call counted stuck"
                )
                # Its only slot is stuck: not ready, refused at the head with a reason.
                assert not eng.ready()
                status = eng.status().models["t"]
                assert not status.ready
                assert status.reason is not None and "hung" in status.reason
                with pytest.raises(errors.Overloaded) as info:
                    h.admit()
                assert info.value.status == 503
                assert int(dict(info.value.headers)[b"retry-after"]) >= 1
            finally:
                released.set()
            await await_until(lambda: now(eng.ready()), WAIT_S, "the thread returned")
            assert workers(eng, "t").stuck == 0
            r = await h.infer(h.admit(), {"x": np.arange(2)})
            assert r.outputs["x"].tolist() == [0, 1]
            r.release()

    run(main())


def test_thread_stream_step_abandoned_holds_one_thread(run: Any, arena: Any) -> None:
    async def main() -> None:
        model, released, began = thread_model()
        async with reclaim_engine("thread", {"t": model}, arena) as eng:
            h = eng.model("t")
            try:
                stream = h.generate(h.admit(), GenerateRequest(prompt="hang"))
                assert await stream.__anext__() == "first"
                await await_until(lambda: now(began.is_set()), WAIT_S, "the step hanging")
                await stream.aclose()  # the client disconnects
                await await_until(
                    lambda: now(workers(eng, "t").stuck == 1), WAIT_S, "the step counted stuck"
                )
                # One pool thread is stuck; the slot still has a thread: the model serves.
                stats = workers(eng, "t")
                assert (stats.ready, stats.streams) == (1, 0)
                assert eng.ready() and eng.status().models["t"].reason is None
                r = await h.infer(h.admit(), {"x": np.arange(2)})
                assert r.outputs["x"].tolist() == [0, 1]
                r.release()
            finally:
                released.set()
            await await_until(
                lambda: now(workers(eng, "t").stuck == 0), WAIT_S, "the step returned"
            )

    run(main())


# -- inline --------------------------------------------------------------------------------------
def test_inline_async_call_abandoned_holds_nothing(run: Any, arena: Any) -> None:
    async def main() -> None:
        started = [0]
        models = {"a": {"factory": HangingAsync, "options": {"started": started}}}
        async with reclaim_engine("inline", models, arena) as eng:
            h = eng.model("a")
            call = asyncio.ensure_future(h.infer(h.admit(), {"hang": np.zeros(1)}))
            stream = h.generate(h.admit(), GenerateRequest(prompt="hang"))
            assert await stream.__anext__() == "first"
            await await_until(lambda: now(started[0] == 2), WAIT_S, "both calls running")
            call.cancel()
            await stream.aclose()
            await await_until(
                lambda: now(workers(eng, "a").busy == 0 and workers(eng, "a").streams == 0),
                WAIT_S,
                "the calls cancelled",
            )
            assert workers(eng, "a").stuck == 0 and eng.ready()
            assert h.statistics().queue.in_flight == 0
            r = await h.infer(h.admit(), {"x": np.arange(2)})
            assert r.outputs["x"].tolist() == [0, 1]
            r.release()

    run(main())
