"""Replacing a loaded model without dropping anything (docs/architecture.md, "Models at
run time"; runtime/model_replace.py), on every executor and loop: a load of a loaded
model whose catalog entry changed serves the new version to new requests while the
streams of the old one run to their end, then stops the old one; an unchanged entry's
load does nothing; a new version that cannot load leaves the old one serving."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.runtime.helpers import engine, until
from tests.support.models.engine import Versioned
from zeroserve.models.base import GenerateRequest
from zeroserve.models.catalog import CatalogEntry
from zeroserve.models.loader import ModelRef
from zeroserve.runtime import ModelLoadError
from zeroserve.runtime.model_manager import ModelManager
from zeroserve.runtime.model_state import ModelState

TARGET = "tests.support.models.engine:Versioned"


def _entry(executor: str, **options: Any) -> CatalogEntry:
    ref = ModelRef(name="v", target=TARGET, options=options, runtime={"executor": executor})
    return CatalogEntry(ref=ref, origin="test")


def _alive(pid: int) -> bool:
    return Path(f"/proc/{pid}").exists()


class _Listener:
    """Records the manager's announcements, as the backend table would hear them."""

    def __init__(self) -> None:
        self.events: list[tuple[str, str]] = []

    def model_loaded(self, name: str) -> None:
        self.events.append(("loaded", name))

    def model_replaced(self, name: str) -> Any:
        self.events.append(("replaced", name))

        async def close_old() -> None:
            self.events.append(("old closed", name))

        return close_old

    async def model_unloaded(self, name: str) -> None:
        self.events.append(("unloaded", name))


def test_a_changed_entry_replaces_the_model_and_its_streams_finish(
    run: Any, executor: str, arena: Any, tmp_path: Path
) -> None:
    hold = str(tmp_path / "hold")
    first = _entry(executor, version="v1", hold=hold)

    async def main() -> None:
        models = {"v": {"factory": Versioned, "options": {"version": "v1", "hold": hold}}}
        async with engine(executor, models, arena=arena) as eng:
            listener = _Listener()
            mgr = ModelManager(eng, {"v": first}, loaded=["v"], listener=listener)
            await mgr.load("v")  # unchanged: nothing to do
            assert mgr.status("v").loads == 1 and listener.events == []

            old = eng.model("v")
            held = [old.generate(old.admit(), GenerateRequest(prompt="")) for _ in range(3)]
            tags = {await s.__anext__() for s in held}
            assert len(tags) == 1
            old_version, old_pid = tags.pop().strip().split("@")
            assert old_version == "v1"

            await mgr.rescan({"v": _entry(executor, version="v2", hold=hold)})
            await mgr.load("v")
            status = mgr.status("v")
            assert status.state is ModelState.LOADED and status.replacing
            assert listener.events == [("replaced", "v")]

            # New requests get the new version, the old one's streams are still open.
            new = eng.model("v")
            result = await new.infer(new.admit(), {"raw": np.zeros(1, np.uint8)})
            new_version, new_pid = bytes(result.outputs["raw"]).decode().split("@")
            result.release()
            assert new_version == "v2"
            if executor == "process":
                assert new_pid != old_pid and _alive(int(old_pid))
            fresh = new.generate(new.admit(), GenerateRequest(prompt=""))
            assert (await fresh.__anext__()).startswith("v2@")

            Path(hold).touch()
            assert [[p async for p in s] for s in held] == [["done"]] * 3
            assert [p async for p in fresh] == ["done"]
            await mgr.wait_retired("v")
            assert not mgr.status("v").replacing
            assert listener.events == [("replaced", "v"), ("old closed", "v")]
            if executor == "process":
                await until(lambda: not _alive(int(old_pid)), "the old worker to exit")
            assert eng.names() == ["v"] and eng.ready()
            assert mgr.statistics()["v"].loads == 1  # the replace's load
            await mgr.load("v")  # the new version is what is loaded now
            assert listener.events[-1] == ("old closed", "v")

    run(main())


def test_no_request_fails_while_a_model_is_replaced(
    run: Any, executor: str, arena: Any, tmp_path: Path
) -> None:
    async def main() -> None:
        models = {"v": {"factory": Versioned, "options": {"version": "v1"}}}
        async with engine(executor, models, arena=arena) as eng:
            mgr = ModelManager(eng, {"v": _entry(executor, version="v1")}, loaded=["v"])
            seen: list[str] = []
            stop = asyncio.Event()

            async def client() -> None:
                while not stop.is_set():
                    h = eng.model("v")
                    r = await h.infer(h.admit(), {"raw": np.zeros(1, np.uint8)})
                    seen.append(bytes(r.outputs["raw"]).decode().split("@")[0])
                    r.release()
                    await asyncio.sleep(0)  # let the replace's steps run between requests

            def served(version: str) -> Callable[[], bool]:
                return lambda: version in seen

            clients = [asyncio.ensure_future(client()) for _ in range(4)]
            for n in range(2, 5):
                await mgr.rescan({"v": _entry(executor, version=f"v{n}")})
                await mgr.load("v")
                await until(served(f"v{n}"), "a request served by the new version")
            stop.set()
            await asyncio.gather(*clients)  # any failed request raises here
            await mgr.wait_retired("v")
            # Requests admitted before a switch may finish after one admitted after it, so
            # the order of ``seen`` proves nothing; a request now gets the last version.
            h = eng.model("v")
            r = await h.infer(h.admit(), {"raw": np.zeros(1, np.uint8)})
            assert bytes(r.outputs["raw"]).decode().startswith("v4@")
            r.release()
            assert mgr.statistics()["v"].loads == 3

    run(main())


def test_a_new_version_that_cannot_load_leaves_the_old_one_serving(
    run: Any, executor: str, arena: Any
) -> None:
    async def main() -> None:
        models = {"v": {"factory": Versioned, "options": {"version": "v1"}}}
        async with engine(executor, models, arena=arena) as eng:
            mgr = ModelManager(eng, {"v": _entry(executor, version="v1")}, loaded=["v"])
            broken = CatalogEntry(
                ref=ModelRef(
                    name="v",
                    target="tests.support.models.engine:BrokenLoad",
                    runtime={"executor": executor},
                ),
                origin="test",
            )
            await mgr.rescan({"v": broken})
            with pytest.raises(ModelLoadError, match="weights file is missing"):
                await mgr.load("v")
            status = mgr.status("v")
            assert status.state is ModelState.LOADED and not status.replacing
            h = eng.model("v")
            r = await h.infer(h.admit(), {"raw": np.zeros(1, np.uint8)})
            assert bytes(r.outputs["raw"]).decode().startswith("v1@")
            r.release()
            assert mgr.statistics()["v"].failed_loads == 1
            assert eng.names() == ["v"]

    run(main())
