"""The model manager's room (docs/architecture.md, "Models at run time"): what a failed
load tells a client, the memory cap, and a load that waits for room instead of failing."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.runtime.helpers import engine, until
from tests.support.models.engine import Echo
from zeroserve.errors import Overloaded, RequestError
from zeroserve.models.catalog import CatalogEntry
from zeroserve.models.loader import ModelRef
from zeroserve.runtime import ManualClock, ModelLoadError
from zeroserve.runtime.model_manager import ModelManager
from zeroserve.runtime.model_memory import rss_bytes
from zeroserve.runtime.model_room import Room
from zeroserve.runtime.model_state import ModelState

SECRET_DIR = "/srv/private/models"
# The memory a Ballast model holds: far above the noise of a load's RSS delta.
BALLAST_MIB = 64


def _entry(name: str, cls: str, executor: str, **options: Any) -> CatalogEntry:
    ref = ModelRef(
        name=name,
        target=f"tests.support.models.engine:{cls}",
        options=options,
        runtime={"executor": executor},
    )
    return CatalogEntry(ref=ref, origin="test")


def test_a_failed_loads_reason_names_no_server_path_but_the_log_does(
    run: Any, executor: str, arena: Any, caplog: pytest.LogCaptureFixture
) -> None:
    catalog = {"echo": _entry("echo", "Echo", executor)}
    catalog["missing"] = _entry("missing", "MissingWeights", executor)

    async def main() -> None:
        async with engine(executor, {"echo": {"factory": Echo}}, arena=arena) as eng:
            mgr = ModelManager(eng, catalog, loaded=["echo"])
            with pytest.raises(ModelLoadError) as info:
                await mgr.load("missing")
            assert SECRET_DIR not in str(info.value) and "weights.bin" in str(info.value)
            assert "No such file or directory" in info.value.cause
            reason = mgr.status("missing").reason
            assert reason is not None and SECRET_DIR not in reason and "weights.bin" in reason
            with pytest.raises(ModelLoadError) as again:
                await mgr.ensure("missing")  # the remembered failure, as autoload answers
            assert SECRET_DIR not in str(again.value)

    with caplog.at_level(logging.WARNING, logger="zeroserve"):
        run(main())
    assert any(f"{SECRET_DIR}/weights.bin" in r.getMessage() for r in caplog.records)


def test_a_load_without_room_waits_for_a_model_to_go_idle_and_nothing_is_cut(
    run: Any, executor: str, arena: Any
) -> None:
    clock = ManualClock()
    catalog = {"echo": _entry("echo", "Echo", executor)}
    catalog["extra"] = CatalogEntry(
        ref=ModelRef(
            name="extra",
            target="tests.support.models.engine:Echo",
            runtime={"executor": executor, "queue_depth": 2},
        ),
        origin="test",
    )

    async def main() -> None:
        async with engine(executor, {"echo": {"factory": Echo}}, arena=arena, clock=clock) as eng:
            mgr = ModelManager(eng, catalog, loaded=["echo"], models_max=1)
            h = eng.model("echo")
            busy = h.admit()  # the test's request in flight on the one model loaded
            first = asyncio.ensure_future(mgr.load("extra"))
            second = asyncio.ensure_future(mgr.load("extra"))
            await until(lambda: mgr.memory().waiting == 1, "the load to wait for room")
            # Two callers wait (the model's queue depth): a third is refused at once.
            with pytest.raises(Overloaded, match="already wait for model 'extra'") as info:
                await mgr.load("extra")
            assert info.value.status == 503 and info.value.retry_after >= 1
            clock.advance(3600.0)  # however long: a model in flight is never evicted
            assert mgr.status("extra").state is ModelState.UNLOADED
            assert eng.names() == ["echo"] and not first.done()
            result = await h.infer(busy, {"x": np.arange(3)})  # it runs to its end
            assert (result.outputs["x"] == np.arange(3)).all()
            result.release()  # echo goes idle: the waiting load evicts it then
            await asyncio.gather(first, second)
            assert eng.names() == ["extra"] and mgr.evictions == 1
            assert mgr.status("extra").loads == 1 and mgr.memory().waiting == 0

    run(main())


def test_a_load_whose_callers_all_left_stops_waiting_for_room(
    run: Any, executor: str, arena: Any
) -> None:
    catalog = {"echo": _entry("echo", "Echo", executor), "extra": _entry("extra", "Echo", executor)}

    async def main() -> None:
        async with engine(executor, {"echo": {"factory": Echo}}, arena=arena) as eng:
            mgr = ModelManager(eng, catalog, loaded=["echo"], models_max=1)
            busy = eng.model("echo").admit()
            caller = asyncio.ensure_future(mgr.load("extra"))
            await until(lambda: mgr.memory().waiting == 1, "the load to wait for room")
            caller.cancel()  # the request gave up (a disconnect, its deadline)
            await until(lambda: mgr.memory().waiting == 0, "the room wait to end")
            busy.release()
            assert eng.names() == ["echo"] and mgr.status("extra").state is ModelState.UNLOADED
            assert mgr.status("extra").loads == 0 and mgr.evictions == 0
            await mgr.load("extra")  # a later request loads it afresh
            assert eng.names() == ["extra"]

    run(main())


def test_over_the_memory_cap_the_least_recently_used_idle_model_is_unloaded(
    run: Any, executor: str, arena: Any
) -> None:
    clock = ManualClock()
    catalog = {n: _entry(n, "Ballast", executor, mib=BALLAST_MIB) for n in ("a", "b")}

    eng = engine(executor, {}, arena=arena, clock=clock)
    run(eng.start())
    try:  # one bounded run() per load: a process model's load spawns a worker
        probe = ModelManager(eng, catalog)
        run(probe.load("a"))
        cost = probe.statistics()["a"].memory_bytes
        assert cost >= BALLAST_MIB << 20  # measured: the RSS its load added
        run(probe.unload("a"))
        # Room for one Ballast and a half: the second one's load pushes the first out.
        mgr = ModelManager(eng, catalog, models_memory=cost * 3 // 2)
        run(mgr.load("a"))
        clock.advance(1.0)
        run(mgr.load("b"))  # not measured yet (no estimate): loads, then sheds a
        assert eng.names() == ["b"] and mgr.evictions == 1
        stats = mgr.statistics()
        assert stats["a"].memory_bytes == 0 and stats["b"].memory_bytes >= BALLAST_MIB << 20
        memory = mgr.memory()
        assert memory.cap == cost * 3 // 2 and memory.used <= memory.cap
        clock.advance(1.0)
        run(mgr.load("a"))  # measured once: room is made before it loads
        assert eng.names() == ["a"] and mgr.evictions == 2
        run(mgr.unload("a"))
        assert mgr.memory().used == 0
    finally:
        run(eng.aclose())


def test_a_model_larger_than_the_memory_cap_fails_with_the_reason(run: Any, arena: Any) -> None:
    catalog = {"a": _entry("a", "Ballast", "inline", mib=BALLAST_MIB)}

    async def main() -> None:
        async with engine("inline", {}, arena=arena) as eng:
            probe = ModelManager(eng, catalog)
            await probe.load("a")
            await probe.unload("a")
            mgr = ModelManager(eng, catalog, models_memory=1 << 20)
            mgr.room.measured.update(probe.room.measured)  # as if loaded before
            with pytest.raises(ModelLoadError, match="more than --models-memory"):
                await mgr.load("a")
            assert mgr.status("a").state is ModelState.FAILED and eng.names() == []

    run(main())


def test_the_idle_period_keeps_the_longest_keep_alive_its_requests_asked(
    run: Any, arena: Any
) -> None:
    clock = ManualClock()
    catalog = {"echo": _entry("echo", "Echo", "inline")}
    catalog["kept"] = CatalogEntry(ref=_entry("kept", "Echo", "inline").ref, origin="t", pin=True)

    async def main() -> None:
        async with engine("inline", {}, arena=arena, clock=clock) as eng:
            mgr = ModelManager(eng, catalog, keep_alive_s=300.0)
            await mgr.load("echo")
            h = eng.model("echo")

            async def request(keep_alive: float | None) -> None:
                if keep_alive is not None:
                    mgr.ask_keep_alive("echo", keep_alive)
                (await h.infer(h.admit(), {"x": np.arange(1)})).release()

            await request(30.0)
            await request(600.0)  # busy period: 30 s and 600 s asked: 600 s wins
            clock.advance(599.0)
            assert mgr.idle_models() == []
            clock.advance(1.0)
            assert mgr.idle_models() == ["echo"]
            await request(None)  # a new busy period asking nothing: the default again
            clock.advance(300.0)
            assert mgr.idle_models() == ["echo"]
            await request(-1.0)  # negative: kept until unloaded by hand
            clock.advance(1e9)
            assert mgr.idle_models() == []
            await request(0.0)
            assert await mgr.unload_idle() == ["echo"]  # idle since now: 0 s is enough
            with pytest.raises(RequestError, match="'kept' is pinned") as info:
                mgr.ask_keep_alive("kept", 10.0)
            assert info.value.param == "keep_alive"

    run(main())


def test_a_worker_started_again_is_measured_again(run: Any, arena: Any, tmp_path: Path) -> None:
    size = tmp_path / "mib"
    size.write_text(str(BALLAST_MIB))
    catalog = {"a": _entry("a", "FileBallast", "process", path=str(size))}

    async def main() -> None:
        async with engine("process", {}, arena=arena) as eng:
            mgr = ModelManager(eng, catalog)
            await mgr.load("a")
            (first,) = eng.worker_pids("a")
            cost = mgr.statistics()["a"].memory_bytes
            assert cost >= BALLAST_MIB << 20
            size.write_text(str(3 * BALLAST_MIB))  # the next worker holds twice as much more
            os.kill(first, signal.SIGKILL)
            await until(lambda: eng.worker_pids("a") not in ([], [first]), "a new worker")
            again = mgr.statistics()["a"].memory_bytes
            assert again - cost >= (2 * BALLAST_MIB << 20) * 9 // 10, (cost, again)
            assert mgr.memory().used == again
            assert mgr.room.measured["a"] == again  # what its next load expects

    run(main())


def test_the_room_follows_the_processes_of_a_model() -> None:
    pids: dict[str, list[int]] = {"a": [os.getpid()]}
    room = Room(None, None, lambda name: pids[name])
    grown = 1000
    room.counted["a"] = room.measure("a", grown, pids["a"])
    first = room.count("a")
    assert first > grown
    pids["a"] = []  # none serves (being started again): it keeps what it counted
    assert room.count("a") == first
    # Another process serves it: measured once, its RSS and the load's growth.
    other = subprocess.Popen(
        [sys.executable, "-c", "print(flush=True); import sys; sys.stdin.read()"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
    )
    try:
        assert other.stdout is not None and other.stdout.readline() == b"\n"  # it runs
        pids["a"] = [other.pid]
        counted = room.count("a")
        rss = rss_bytes(other.pid)
        assert rss is not None and abs(counted - grown - rss) < (1 << 20)
        assert room.measured["a"] == counted and room.used() == counted
        del pids["a"]  # loading again (the engine does not have it): left to its load
        assert room.count("a") == counted
        del room.counted["a"]  # unloaded: forgotten
        room.follow()
        assert room.count("a") == 0
    finally:
        for pipe in (other.stdin, other.stdout):
            assert pipe is not None
            pipe.close()  # its stdin's end ends it
        other.wait()
