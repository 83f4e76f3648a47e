"""The model manager's room (docs/architecture.md, "Models at run time"): what a failed
load tells a client, the memory cap, and a load that waits for room instead of failing."""

from __future__ import annotations

import logging
from typing import Any

import pytest

from tests.runtime.helpers import engine
from tests.support.models.engine import Echo
from zeroserve.models.catalog import CatalogEntry
from zeroserve.models.loader import ModelRef
from zeroserve.runtime import ModelLoadError
from zeroserve.runtime.model_manager import ModelManager

SECRET_DIR = "/srv/private/models"


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
