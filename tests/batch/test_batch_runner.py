"""The batch runner in process, on a real engine and app (docs/architecture.md, "The Batch
API"): every line reaches its route's handler as a request carrying the batch priority,
and the runner keeps to one line per model while interactive requests are admitted on
that model, taking its full share again once they are gone."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path

from tests.support import await_until
from tests.support.models.streams import GATES, GatedModel
from zeroserve.app import App
from zeroserve.app.batch import BATCH_PRIORITY, BatchOptions
from zeroserve.app.batch import schemas as s
from zeroserve.app.request import Request
from zeroserve.app.response import HandlerResult
from zeroserve.models.echo import EchoModel
from zeroserve.runtime import Engine, ModelConfig

from .conftest import completion_lines, jsonl


class WallClock:
    """The batch API's wall clock, moved by the test."""

    def __init__(self) -> None:
        self.now = 1_800_000_000.0

    def __call__(self) -> float:
        return self.now


async def _app(
    tmp_path: Path, configs: dict[str, ModelConfig], wall: WallClock | None = None, **limits: int
) -> App:
    engine = Engine(configs)
    await engine.start()
    options = BatchOptions(tmp_path / "data", wall=wall or WallClock(), **limits)
    app = App(engine, batch=options)
    app.start()
    return app


async def _close(app: App) -> None:
    await app.aclose()
    await app.engine.aclose()


def _submit(app: App, data: bytes) -> str:
    assert app.batch is not None
    store = app.batch.store
    fid, part = store.part_path()
    part.write_bytes(data)
    source = store.add_file(fid, part, "", "in.jsonl", "batch", data.count(b"\n"))
    create = s.BatchCreate(input_file_id=fid, endpoint="/v1/completions", completion_window="24h")
    batch = store.create_batch("", create, source)
    app.batch.runner.wake()
    return batch.id


def test_every_line_runs_with_the_batch_priority(tmp_path: Path) -> None:
    async def main() -> None:
        app = await _app(tmp_path, {"echo": ModelConfig("echo", EchoModel)})
        seen: list[object] = []
        route, _ = app.router.match("POST", "/v1/completions")
        handler = route.handler

        def observed(req: Request) -> HandlerResult:
            seen.append(getattr(req, "priority", None))
            return handler(req)

        route.handler = observed
        try:
            bid = _submit(app, jsonl(completion_lines(5, "echo")))
            assert app.batch is not None
            store = app.batch.store

            async def ended() -> bool:
                return store.batch(bid, "").status == "completed"

            await await_until(ended, 30, "the batch to complete")
            assert seen == [BATCH_PRIORITY] * 5
            assert store.batch(bid, "").request_counts.completed == 5
        finally:
            await _close(app)

    asyncio.run(main())


def test_the_runner_keeps_to_one_line_beside_interactive_work(tmp_path: Path) -> None:
    lines = 6
    for i in range(lines):
        GATES[f"line-{i}"] = threading.Event()

    async def main() -> None:
        app = await _app(
            tmp_path,
            {"gated": ModelConfig("gated", GatedModel, workers=8)},
            lines_per_model=4,
            lines_queued=0,
        )
        handle = app.engine.model("gated")
        assert app.batch is not None
        runner, store = app.batch.runner, app.batch.store

        def in_flight() -> int:
            return handle.statistics().queue.in_flight

        async def admitted(n: int) -> bool:
            return in_flight() == n

        interactive = handle.admit()  # an interactive request, admitted on the model
        try:
            bid = _submit(app, jsonl(completion_lines(lines, "gated")))
            await await_until(lambda: admitted(2), 30, "one batch line beside it")
            runner.step()  # another look changes nothing while the request is admitted
            assert in_flight() == 2
            interactive.release()
            GATES["line-0"].set()  # a line ends: the runner looks again, and takes its share
            await await_until(lambda: admitted(4), 30, "four batch lines")
            for gate in GATES.values():
                gate.set()

            async def ended() -> bool:
                return store.batch(bid, "").status == "completed"

            await await_until(ended, 30, "the batch to complete")
            assert store.batch(bid, "").request_counts.completed == lines
        finally:
            for gate in GATES.values():
                gate.set()
            await _close(app)

    asyncio.run(main())


def test_a_batch_past_its_window_expires_with_its_unrun_lines_reported(tmp_path: Path) -> None:
    lines = 4
    for i in range(lines):
        GATES[f"line-{i}"] = threading.Event()
    wall = WallClock()

    async def main() -> None:
        app = await _app(
            tmp_path,
            {"gated": ModelConfig("gated", GatedModel, workers=4)},
            wall,
            lines_per_model=1,
            lines_queued=0,
        )
        assert app.batch is not None
        runner, store = app.batch.runner, app.batch.store
        try:
            bid = _submit(app, jsonl(completion_lines(lines, "gated")))
            GATES["line-0"].set()

            async def one_done() -> bool:
                return store.batch(bid, "").request_counts.completed == 1

            await await_until(one_done, 30, "the first line")
            created = store.batch(bid, "")
            assert created.expires_at == created.created_at + 24 * 3600
            wall.now += 24 * 3600  # the window has passed; line-1 is running
            runner.wake()
            GATES["line-1"].set()  # the running line ends (it is not cut), nothing new starts

            async def expired() -> bool:
                return store.batch(bid, "").status == "expired"

            await await_until(expired, 30, "the batch to expire")
            done = store.batch(bid, "")
            assert done.expired_at == int(wall.now)
            assert (done.request_counts.completed, done.request_counts.failed) == (2, 2)
            assert done.error_file_id is not None
            errors = app.batch.store.path(done.error_file_id).read_bytes().splitlines()
            codes = {s.line_result_decoder.decode(e).error.code for e in errors}  # type: ignore[union-attr]
            assert codes == {"batch_expired"}
        finally:
            for gate in GATES.values():
                gate.set()
            await _close(app)

    asyncio.run(main())
