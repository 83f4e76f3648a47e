"""Smoke test of `python -m benchmarks --quick --suites W1,W2`: the harness runs end to end and reports numbers.

No timing assertions: only that every case produced a measured row for the FastAPI peer
(and for zeroserve when its server is importable), and that the report was written.
"""

from __future__ import annotations

import importlib.util
import json
import re
import shutil
from pathlib import Path

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]


def _importable(mod: str) -> bool:
    try:
        return importlib.util.find_spec(mod) is not None
    except (ImportError, ValueError):
        return False


@pytest.mark.skipif(shutil.which("wrk") is None, reason="wrk not installed (make bench-tools)")
@pytest.mark.skipif(
    not _importable("fastapi") or not _importable("uvicorn"),
    reason="bench extra (fastapi, uvicorn) not installed",
)
def test_quick_bench_writes_table(tmp_path: Path) -> None:
    from benchmarks.cli import main

    servers = ["fastapi"] + (["zeroserve"] if _importable("zeroserve.cli") else [])
    out = tmp_path / "BENCHMARKS.md"
    rc = main(
        [
            "--quick",
            "--suites",
            "W1,W2",
            "--servers",
            ",".join(servers),
            "--out",
            str(out),
            "--results-dir",
            str(tmp_path / "results"),
            "--no-strace",
        ]
    )
    assert rc == 0

    runs = [
        r
        for scenario in ("W1", "W2")
        for r in json.loads((tmp_path / "results" / f"wrk-{scenario}.json").read_text())
    ]
    fastapi = [r for r in runs if r["server"] == "fastapi"]
    assert {r["case"] for r in fastapi} >= {"W1-64KiB", "W1-1MiB", "W1-8MiB", "W2-sse-c32"}
    for r in fastapi:
        assert r["ok"], r["error"]
        assert r["requests"] > 0
        assert r["cpu_ms_per_request"] > 0

    text = out.read_text()
    assert "### W1" in text and "### W2" in text
    # How to reproduce it, without where this run wrote its results.
    assert "Reproduce: `python -m benchmarks --quick --suites W1,W2" in text
    assert str(tmp_path) not in text
    row = re.compile(r"^\| 64 KiB x32 \| FastAPI\+uvicorn \| [\d,.]+ \| 1\.00x \|", re.M)
    assert row.search(text), text
    assert re.search(r"^\| raw SSE x32 \| FastAPI\+uvicorn \| [\d,.]+ \|", text, re.M), text
    # Each part says how much CPU the hypervisor took while it ran (from /proc/stat).
    assert re.search(r"CPU time stolen by the hypervisor during this part: CPU \d+ [\d.]+ %", text)
