"""The batch runner in process, on a real engine and app (docs/architecture.md, "The Batch
API"): every line reaches its route's handler as a request carrying the batch priority,
and the runner keeps to one line per model while interactive requests are admitted on
that model, taking its full share again once they are gone."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path

from tests.openai.openai_test_models import GATES, GatedModel
from tests.support import await_until

from zeroserve.app import App
from zeroserve.app.batch import BATCH_PRIORITY, BatchOptions
from zeroserve.app.batch import schemas as s
from zeroserve.app.request import Request
from zeroserve.app.response import HandlerResult
from zeroserve.models.echo import EchoModel
from zeroserve.runtime import Engine, ModelConfig

from .conftest import completion_lines, jsonl


async def _app(tmp_path: Path, configs: dict[str, ModelConfig], **limits: int) -> App:
    engine = Engine(configs)
    await engine.start()
    app = App(engine, batch=BatchOptions(tmp_path / "data", **limits))
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
            tmp_path, {"gated": ModelConfig("gated", GatedModel, workers=8)}, lines_per_model=4
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
