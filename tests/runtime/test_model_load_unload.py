"""Loading and unloading one model while the engine serves others (docs/architecture.md, "Models at run time"),
on every executor and loop: an unload lets admitted work finish, a failed load leaves
nothing behind, and load/unload cycles leave processes, threads and fds as they were."""

from __future__ import annotations

import asyncio
import multiprocessing
import os
import threading
from typing import Any

import numpy as np
import pytest

from tests.runtime.helpers import counter, engine, flag, until
from tests.support.models.engine import BrokenLoad, Echo, Gate
from zeroserve.errors import ModelNotFound, Overloaded
from zeroserve.runtime import InferResult, ModelLoadError
from zeroserve.runtime.options import ModelConfig


async def _infer(eng: Any, name: str, inputs: Any) -> InferResult:
    h = eng.model(name)
    result: InferResult = await h.infer(h.admit(), inputs)
    return result


def test_a_model_loaded_at_run_time_serves_and_its_unload_lets_work_finish(
    run: Any, executor: str, arena: Any
) -> None:
    gate, started, finished = flag(), counter(), counter()
    cfg = ModelConfig(
        name="gate",
        factory=Gate,
        executor=executor,  # type: ignore[arg-type]
        options={"gate": gate, "started": started, "finished": finished},
    )

    async def main() -> None:
        async with engine(executor, {"echo": {"factory": Echo}}, arena=arena) as eng:
            await eng.load("gate", cfg)
            assert eng.names() == ["echo", "gate"] and eng.ready()
            held = eng.model("gate")  # a handle taken before the unload
            pending = asyncio.ensure_future(_infer(eng, "gate", {"x": np.arange(3)}))
            await until(lambda: started.value == 1, "the request to run")

            unloading = asyncio.ensure_future(eng.unload("gate"))
            await until(lambda: "gate" not in eng._handles, "the unload to begin")
            with pytest.raises(ModelNotFound):
                eng.model("gate")  # new requests no longer find it
            with pytest.raises(Overloaded, match="being unloaded") as refused:
                held.admit()  # nor do requests that found it just before
            assert refused.value.status == 503
            assert not unloading.done() and "gate" in eng.names()  # in flight: not cut

            gate.set()
            result = await pending
            assert (result.outputs["x"] == np.arange(3)).all()
            result.release()
            await unloading
            assert eng.names() == ["echo"] and eng.ready()
            with pytest.raises(ModelNotFound, match="not loaded"):
                await eng.unload("gate")
            # the other model served throughout
            other = await _infer(eng, "echo", {"y": np.ones(2)})
            other.release()

    run(main())


def test_a_failed_load_names_the_model_and_leaves_nothing(
    run: Any, executor: str, arena: Any
) -> None:
    cfg = ModelConfig(name="broken", factory=BrokenLoad, executor=executor)  # type: ignore[arg-type]

    async def main() -> None:
        async with engine(executor, {"echo": {"factory": Echo}}, arena=arena) as eng:
            children = set(multiprocessing.active_children())
            with pytest.raises(ModelLoadError, match="weights file is missing") as info:
                await eng.load("broken", cfg)
            assert "broken" in str(info.value)
            assert eng.names() == ["echo"] and eng.ready()
            assert set(multiprocessing.active_children()) <= children
            with pytest.raises(ValueError, match="loaded already"):
                await eng.load("echo", ModelConfig(name="echo", factory=Echo))

    run(main())


def test_load_unload_cycles_leave_processes_threads_and_fds_as_they_were(
    run: Any, executor: str, arena: Any
) -> None:
    cfg = ModelConfig(name="extra", factory=Echo, executor=executor)  # type: ignore[arg-type]

    def resources() -> tuple[int, int, int]:
        return (
            len(multiprocessing.active_children()),
            threading.active_count(),
            len(os.listdir("/proc/self/fd")),
        )

    async def cycle(eng: Any) -> None:
        await eng.load("extra", cfg)
        result = await _infer(eng, "extra", {"x": np.arange(4)})
        result.release()
        await eng.unload("extra")

    async def main() -> None:
        async with engine(executor, {"echo": {"factory": Echo}}, arena=arena) as eng:
            await cycle(eng)  # warm: pools and imports made once
            before = resources()
            for _ in range(3):
                await cycle(eng)
            # none more than before (uvloop may close a handle of the warm cycle late)
            await until(
                lambda: all(now <= then for now, then in zip(resources(), before, strict=True)),
                f"resources back to {before}, now {resources()}",
            )

    run(main())
