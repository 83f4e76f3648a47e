"""The model manager (docs/architecture.md, "Models at run time") on every executor and loop: concurrent loads
share one, a failed load answers every waiter with its reason and is retried later, and
racing loads and unloads end in a state that matches what the engine serves."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Awaitable, Callable
from typing import Any

import numpy as np
import pytest

from tests.runtime.helpers import engine, until
from tests.support.models.engine import Echo
from zeroserve.errors import ModelNotFound, Overloaded
from zeroserve.models.catalog import CatalogEntry
from zeroserve.models.loader import ModelRef
from zeroserve.runtime import ManualClock, ModelLoadError
from zeroserve.runtime.model_manager import FAILED_RETRY_S, ModelManager
from zeroserve.runtime.model_state import ModelState


def _entry(name: str, cls: str, executor: str) -> CatalogEntry:
    ref = ModelRef(
        name=name, target=f"tests.support.models.engine:{cls}", runtime={"executor": executor}
    )
    return CatalogEntry(ref=ref, origin="test")


def _catalog(executor: str) -> dict[str, CatalogEntry]:
    return {
        "echo": _entry("echo", "Echo", executor),
        "extra": _entry("extra", "Echo", executor),
        "broken": _entry("broken", "BrokenLoad", executor),
    }


def test_concurrent_loads_share_one_and_the_model_serves(
    run: Any, executor: str, arena: Any
) -> None:
    async def main() -> None:
        async with engine(executor, {"echo": {"factory": Echo}}, arena=arena) as eng:
            mgr = ModelManager(eng, _catalog(executor), loaded=["echo"])
            assert mgr.status("extra").state is ModelState.UNLOADED
            await asyncio.gather(*(mgr.load("extra") for _ in range(5)))
            assert mgr.status("extra").state is ModelState.LOADED
            assert mgr.status("extra").loads == 1
            h = eng.model("extra")
            result = await h.infer(h.admit(), {"x": np.arange(2)})
            assert (result.outputs["x"] == np.arange(2)).all()
            result.release()
            await mgr.load("extra")  # loaded: nothing to do
            assert mgr.status("extra").loads == 1
            await mgr.unload("extra")
            assert mgr.status("extra").state is ModelState.UNLOADED
            assert sorted(eng.names()) == ["echo"]

    run(main())


def test_a_failed_load_answers_every_waiter_and_is_retried(
    run: Any, executor: str, arena: Any
) -> None:
    async def main() -> None:
        async with engine(executor, {"echo": {"factory": Echo}}, arena=arena) as eng:
            mgr = ModelManager(eng, _catalog(executor), loaded=["echo"])
            outcomes = await asyncio.gather(
                *(mgr.load("broken") for _ in range(3)), return_exceptions=True
            )
            assert all(isinstance(o, ModelLoadError) for o in outcomes)
            status = mgr.status("broken")
            assert status.state is ModelState.FAILED and status.loads == 1
            assert status.reason is not None and "weights file is missing" in status.reason
            with pytest.raises(ModelLoadError):
                await mgr.load("broken")
            assert mgr.status("broken").loads == 2
            await mgr.unload("broken")
            assert mgr.status("broken").state is ModelState.UNLOADED
            assert eng.names() == ["echo"] and eng.ready()

    run(main())


def test_an_unknown_name_is_not_found_by_name(run: Any, arena: Any) -> None:
    async def main() -> None:
        async with engine("inline", {"echo": {"factory": Echo}}, arena=arena) as eng:
            mgr = ModelManager(eng, _catalog("inline"), loaded=["echo"])
            for op in (mgr.load, mgr.unload):
                with pytest.raises(ModelNotFound, match="'nope' is not in the catalog"):
                    await op("nope")

    run(main())


def test_racing_loads_and_unloads_end_consistent(run: Any, executor: str, arena: Any) -> None:
    rng = random.Random(7)
    ops = [rng.choice(["load", "unload"]) for _ in range(12)]

    async def main() -> None:
        async with engine(executor, {"echo": {"factory": Echo}}, arena=arena) as eng:
            mgr = ModelManager(eng, _catalog(executor), loaded=["echo"])
            for _ in range(2):
                await asyncio.gather(*(getattr(mgr, op)("extra") for op in ops))
                state = mgr.status("extra").state
                assert state in (ModelState.LOADED, ModelState.UNLOADED)
                assert (state is ModelState.LOADED) == ("extra" in eng.names())
            await mgr.unload("extra")
            assert eng.names() == ["echo"]

    run(main())


def test_an_idle_model_is_unloaded_after_keep_alive_unless_pinned_or_busy(
    run: Any, executor: str, arena: Any
) -> None:
    clock = ManualClock()
    catalog = _catalog(executor)
    catalog["kept"] = CatalogEntry(ref=_entry("kept", "Echo", executor).ref, origin="t", pin=True)

    async def main() -> None:
        async with engine(executor, {"echo": {"factory": Echo}}, arena=arena, clock=clock) as eng:
            mgr = ModelManager(eng, catalog, loaded=["echo"], keep_alive_s=300.0)
            await mgr.load("extra")
            await mgr.load("kept")
            clock.advance(299.0)
            assert mgr.idle_models() == []

            h = eng.model("extra")
            ticket = h.admit()  # in flight: never idle, however long
            clock.advance(600.0)
            assert sorted(mgr.idle_models()) == ["echo"]
            result = await h.infer(ticket, {"x": np.arange(2)})
            result.release()
            clock.advance(299.0)  # idle since the request ended: not yet
            assert await mgr.unload_idle() == ["echo"]
            clock.advance(1.0)
            assert await mgr.unload_idle() == ["extra"]
            assert mgr.status("extra").state is ModelState.UNLOADED
            assert mgr.status("kept").state is ModelState.LOADED  # pinned
            assert eng.names() == ["kept"]

    run(main())


def test_keep_alive_must_not_be_negative(run: Any, arena: Any) -> None:
    async def main() -> None:
        async with engine("inline", {"echo": {"factory": Echo}}, arena=arena) as eng:
            with pytest.raises(ValueError, match="keep_alive_s"):
                ModelManager(eng, _catalog("inline"), keep_alive_s=-1.0)

    run(main())


def test_over_models_max_the_least_recently_used_idle_unpinned_model_goes_first(
    run: Any, executor: str, arena: Any
) -> None:
    clock = ManualClock()
    catalog = _catalog(executor)
    catalog["third"] = _entry("third", "Echo", executor)
    catalog["kept"] = CatalogEntry(ref=_entry("kept", "Echo", executor).ref, origin="t", pin=True)

    async def main() -> None:
        async with engine(executor, {"echo": {"factory": Echo}}, arena=arena, clock=clock) as eng:
            mgr = ModelManager(eng, catalog, loaded=["echo"], models_max=2)
            clock.advance(1.0)
            await mgr.load("extra")
            clock.advance(1.0)
            h = eng.model("echo")  # echo used after extra: extra is now the LRU
            (await h.infer(h.admit(), {"x": np.arange(1)})).release()
            await mgr.load("third")
            assert sorted(eng.names()) == ["echo", "third"] and mgr.evictions == 1
            assert mgr.status("extra").state is ModelState.UNLOADED

            await mgr.unload("third")
            await mgr.load("kept")  # pinned: never evicted
            busy = eng.model("echo").admit()  # in flight: not idle, not evicted
            waiting = asyncio.ensure_future(mgr.load("extra"))  # waits for room
            await until(lambda: mgr.memory().waiting == 1, "the load to wait for room")
            with pytest.raises(Overloaded, match="found no room to load in time") as info:
                await mgr.load("extra", timeout=0)  # a caller whose deadline has come
            assert info.value.status == 503
            assert mgr.status("extra").state is ModelState.UNLOADED
            busy.release()
            await waiting  # echo is idle again: it makes room then
            assert sorted(eng.names()) == ["extra", "kept"] and mgr.evictions == 2

    run(main())


def test_a_rescan_adds_new_entries_and_unloads_the_ones_gone(
    run: Any, executor: str, arena: Any
) -> None:
    async def main() -> None:
        async with engine(executor, {"echo": {"factory": Echo}}, arena=arena) as eng:
            mgr = ModelManager(eng, _catalog(executor), loaded=["echo"])
            await mgr.load("extra")
            fresh = {"echo": _catalog(executor)["echo"], "new": _entry("new", "Echo", executor)}
            added, removed = await mgr.rescan(fresh)
            assert added == ["new"] and sorted(removed) == ["broken", "extra"]
            assert sorted(mgr.statuses()) == ["echo", "new"]
            assert mgr.status("new").state is ModelState.UNLOADED
            assert eng.names() == ["echo"]
            with pytest.raises(ModelNotFound, match="'extra' is not in the catalog"):
                await mgr.load("extra")
            await mgr.load("new")
            assert sorted(eng.names()) == ["echo", "new"]

    run(main())


class _Listener:
    """Records what the manager announces; refuses ``refused`` when it loads."""

    def __init__(self, refused: str = "") -> None:
        self.events: list[tuple[str, str]] = []
        self.refused = refused

    def model_loaded(self, name: str) -> None:
        if name == self.refused:
            raise ValueError("no backend serves it")
        self.events.append(("loaded", name))

    def model_replaced(self, name: str) -> Callable[[], Awaitable[None]]:
        raise AssertionError("no model is replaced here")

    async def model_unloaded(self, name: str) -> None:
        self.events.append(("unloaded", name))


def test_the_idle_timer_unloads_on_the_engine_clock_and_tells_the_listener(
    run: Any, arena: Any
) -> None:
    clock = ManualClock()

    async def main() -> None:
        async with engine("inline", {"echo": {"factory": Echo}}, arena=arena, clock=clock) as eng:
            listener = _Listener()
            mgr = ModelManager(eng, _catalog("inline"), loaded=["echo"], keep_alive_s=60.0)
            mgr.listener = listener
            mgr.start(every_s=1.0)
            try:
                await mgr.load("extra")
                clock.advance(30.0)  # timers fire; nothing has been idle 60 s yet
                assert mgr.idle_models() == []
                assert mgr.status("extra").state is ModelState.LOADED
                clock.advance(31.0)
                await until(lambda: mgr.status("extra").state is ModelState.UNLOADED, "unload")
                await until(lambda: eng.names() == [], "echo's unload too")
                assert listener.events[0] == ("loaded", "extra")
                assert sorted(listener.events[1:]) == [("unloaded", "echo"), ("unloaded", "extra")]
                stats = mgr.statistics()["extra"]
                assert (stats.loads, stats.unloads, stats.loaded) == (1, 1, 0)
            finally:
                await mgr.aclose()
            assert clock.pending_timers == 0

    run(main())


def test_a_listener_that_refuses_a_model_fails_its_load(run: Any, arena: Any) -> None:
    clock = ManualClock()

    async def main() -> None:
        async with engine("inline", {"echo": {"factory": Echo}}, arena=arena, clock=clock) as eng:
            mgr = ModelManager(eng, _catalog("inline"), loaded=["echo"])
            mgr.listener = _Listener(refused="extra")
            with pytest.raises(ModelLoadError, match="no backend serves it"):
                await mgr.load("extra")
            assert mgr.status("extra").state is ModelState.FAILED
            assert eng.names() == ["echo"]  # the engine does not keep what no one serves
            # ensure (a request's autoload) answers the failure again without loading...
            with pytest.raises(ModelLoadError, match="no backend serves it"):
                await mgr.ensure("extra")
            assert mgr.status("extra").loads == 1 and mgr.retry_after("extra") >= 1.0
            # ...until the backoff has passed.
            clock.advance(FAILED_RETRY_S)
            with pytest.raises(ModelLoadError):
                await mgr.ensure("extra")
            assert mgr.status("extra").loads == 2
            assert mgr.statistics()["extra"].failed_loads == 2

    run(main())
