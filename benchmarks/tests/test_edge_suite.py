"""The EDGE suite end to end in --quick mode: the keyed and unkeyed zeroserve are both
measured in pairs of slices (the key accepted on every request), the target lines give
the pairs' spread, the key's in-process cost and its instructions (where valgrind is
installed) are reported, the HTTPS runs complete through
wrk, and zeroserve's copies at the ``tls`` site are reported. No timing assertions."""

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
@pytest.mark.skipif(shutil.which("openssl") is None, reason="the openssl CLI is not installed")
@pytest.mark.skipif(
    not _importable("fastapi") or not _importable("uvicorn"),
    reason="bench extra (fastapi, uvicorn) not installed",
)
def test_quick_edge_measures_keys_and_tls(tmp_path: Path) -> None:
    from benchmarks.cli import main
    from benchmarks.paired import QUICK_PAIRS_PER_ROUND

    out, results = tmp_path / "BENCHMARKS.md", tmp_path / "results"
    rc = main(["--quick", "--suites", "EDGE", "--out", str(out), "--results-dir", str(results)])
    assert rc == 0
    keys = json.loads((results / "wrk-EDGE-keys.json").read_text())
    slices: dict[tuple[str, str], list[int]] = {}
    for r in keys:
        assert r["ok"] and r["wrk_errors"] == 0, r["error"]  # a refused key would be 401s
        slices.setdefault((r["server"], r["case"]), []).append(r["round"])
    # Every server has one slice per pair of every case.
    assert slices == {
        (s, c): list(range(QUICK_PAIRS_PER_ROUND))
        for s in ("zeroserve", "zeroserve-key")
        for c in ("W1-64KiB", "W2-sse-c32")
    }
    # The A/A control: the unkeyed server and its twin, one slice each per pair of W1.
    control: dict[tuple[str, str], list[int]] = {}
    for r in json.loads((results / "wrk-EDGE-aa.json").read_text()):
        assert r["ok"] and r["wrk_errors"] == 0, r["error"]
        control.setdefault((r["server"], r["case"]), []).append(r["round"])
    assert control == {
        (s, "W1-64KiB"): list(range(QUICK_PAIRS_PER_ROUND)) for s in ("zeroserve", "zeroserve-twin")
    }
    cost = json.loads((results / "EDGE-key-cost.json").read_text())
    assert set(cost) == {"plain_us", "keyed_us", "key_us", "number", "repeats"}, cost
    counts = json.loads((results / "EDGE-key-instructions.json").read_text())
    if shutil.which("valgrind"):
        # The header and the key add about 5 k instructions to a ~140 k request; one
        # server process's count moves by about 700 from the next one's.
        assert 50_000 < counts["plain"] < counts["keyed"] < 500_000, counts
        assert counts["starts"] == 1 and counts["requests"] == 100, counts
        assert re.search(
            r"^\| the key in all \| \| \| [\d,]+ \| [\d.]+% \|$", out.read_text(), re.M
        )
    else:
        assert counts == "valgrind is not installed (make bench-tools)"
    tls = {r["server"]: r for r in json.loads((results / "wrk-EDGE-tls.json").read_text())}
    for name in ("zeroserve-tls", "uvicorn-tls"):
        assert tls[name]["ok"] and tls[name]["requests"] > 0, tls[name]["error"]
    # Decryption is the one copy: at least every body byte received, at site tls.
    assert tls["zeroserve-tls"]["copied"]["tls"] >= tls["zeroserve-tls"]["payload"]["in"]
    text = out.read_text()
    pct = r"[\d.]+%"
    pairs = rf"\(95% CI {pct} to {pct}; middle half {pct} to {pct}, {QUICK_PAIRS_PER_ROUND} pairs\)"
    assert re.search(
        rf"^\| 64 KiB x32 with a key \| ≥97% of no-key req/s \| [\d.]+% {pairs} \|", text, re.M
    ), text
    # The key's in-process cost is a difference of two timings; on a busy machine it can
    # read below zero, and the table prints it as measured.
    assert re.search(r"^\| raw SSE x32 \| [\d,.]+ \| -?[\d.]+ \| -?[\d.]+% \|$", text, re.M), text
    assert re.search(r"^\| zeroserve TLS \| [\d,]+ \| [\d.]+x \|", text, re.M), text
    assert "copies at site `tls`" in text
    assert re.search(r"^A/A control, same run: .* [\d.]+x \(95% CI ", text, re.M), text
