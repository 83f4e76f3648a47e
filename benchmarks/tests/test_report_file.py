"""BENCHMARKS.md as `make bench` writes it: results first, how to reproduce them, no path
of the machine that ran them, and the hand-written text kept where it is when a suite
reruns."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from benchmarks.cli import PREAMBLE, describe_tree, reproduce
from benchmarks.report import WITHIN_NOISE, Section, merge, round_ratios

ROOT = Path(__file__).resolve().parents[2]
REPORT = ROOT / "BENCHMARKS.md"
HISTORY = ROOT / "benchmarks" / "HISTORY.md"
MACHINE_PATH = re.compile(r"/tmp/|/home/|/work/")


def test_reproduce_leaves_out_where_results_go() -> None:
    assert reproduce([], None) == "make bench"
    given = ["--suites", "W2", "--out", "/tmp/w2b.md", "--rounds", "3", "--results-dir=/tmp/r"]
    assert reproduce(given, None) == "python -m benchmarks --suites W2 --rounds 3"
    assert reproduce(["--results-dir", "/tmp/r"], None) == "python -m benchmarks"


def _git(tree: Path, *args: str) -> str:
    return subprocess.run(
        ["git", "-C", str(tree), *args], capture_output=True, text=True, check=True
    ).stdout.strip()


def test_a_baseline_tree_is_named_by_its_commit_not_its_path(tmp_path: Path) -> None:
    tree = tmp_path / "base"
    (tree / "src" / "zeroserve").mkdir(parents=True)
    (tree / "src" / "zeroserve" / "cli.py").write_text("")
    _git(tree, "init", "-q")
    _git(tree, "add", ".")
    _git(tree, "-c", "user.name=t", "-c", "user.email=t@example.com", "commit", "-qm", "base")
    commit = _git(tree, "rev-parse", "--short", "HEAD")
    src = str(tree / "src")

    command = reproduce(["--suites", "W1", "--results-dir", str(tmp_path)], src)
    assert command == (
        f"ZSBENCH_BASELINE_SRC=<a checkout of {commit}>/src python -m benchmarks --suites W1"
    )
    (tree / "src" / "zeroserve" / "_compiled.json").write_text("{}")
    assert describe_tree(src) == f"<a checkout of {commit}, compiled>/src"
    assert str(tmp_path) not in reproduce([], src)
    # Not a checkout: still no path.
    loose = tmp_path / "loose" / "src"
    loose.mkdir(parents=True)
    assert describe_tree(str(loose)) == "<another checkout>/src"


def _lines() -> list[str]:
    return REPORT.read_text().splitlines()


def test_the_report_starts_with_how_to_reproduce_it_then_a_results_table() -> None:
    lines = _lines()
    head = "\n".join(lines[:12])
    assert lines[0] == "# Benchmarks"
    assert "make bench" in head and "python -m benchmarks --suites" in head
    first_table = next(i for i, line in enumerate(lines) if line.startswith("|"))
    assert first_table < 40
    # ... and that table is a suite's results: W1's, inside its markers.
    before = "\n".join(lines[:first_table])
    assert "<!-- zeroserve-bench:W1-W2/W1 begin -->" in before and " end -->" not in before
    assert lines[first_table].startswith("| body x conns | server | req/s |")


def test_no_machine_path_in_the_report_or_its_history() -> None:
    for path in (REPORT, HISTORY):
        found = [line for line in path.read_text().splitlines() if MACHINE_PATH.search(line)]
        assert not found, f"{path.name}: {found[:3]}"


def test_the_shortfalls_follow_the_tables() -> None:
    text = REPORT.read_text()
    last_group = text.rindex(" end -->")
    shortfalls = text.index("## Where zeroserve falls short")
    assert shortfalls > last_group
    # Every target a part marks missed has its line there (named by its suite's case).
    listed = text[shortfalls:].split("\n## ", 1)[0]
    for case in ("W1 64 KiB", "W1 1 MiB", "W2 OpenAI chunks x32", "W7", "W8", "gateway"):
        assert case in listed, case


@pytest.mark.parametrize("group,suite", [("W1-W2", "W1"), ("API", "llamacpp"), ("EDGE", "EDGE")])
def test_rerunning_a_suite_replaces_its_part_and_keeps_everything_else(
    group: str, suite: str
) -> None:
    text = REPORT.read_text()
    begin = f"<!-- zeroserve-bench:{group}/{suite} begin -->"
    end = f"<!-- zeroserve-bench:{group}/{suite} end -->"
    part = f"### {suite}\n\nA fresh run."
    merged = merge(text, {suite: Section(group, "unused title", part)})
    i, j = text.index(begin), text.index(end)
    assert merged == text[: i + len(begin)] + "\n" + part + "\n" + text[j:]


def test_a_new_report_starts_with_the_preamble() -> None:
    new = merge(PREAMBLE, {"W3": Section("API", "## API suites", "### W3\n\n| a |\n|---|")})
    assert new.startswith("# Benchmarks\n")
    assert "make bench" in new.split("<!--", 1)[0]


@pytest.mark.parametrize(
    ("ratios", "verdict"),
    [
        ([1.02, 1.04, 1.03, 1.05, 1.01], "met"),
        ([0.95, 0.83, 1.05, 0.97, 0.92], WITHIN_NOISE),  # the interval reaches 1x
        ([0.80, 0.82, 0.81, 0.79, 0.80], "**missed**"),
    ],
)
def test_a_ratio_whose_interval_reaches_its_goal_reads_level_within_noise(
    ratios: list[float], verdict: str
) -> None:
    row = round_ratios("requests/s", "≥1x", ratios, lambda v: v >= 1.0).row()
    assert row.endswith(f"| {verdict} |")
    assert "95 % interval" in row


def test_a_new_group_goes_before_the_shortfalls() -> None:
    existing = "# Benchmarks\n\n<!-- zeroserve-bench:A begin -->\nA\n<!-- zeroserve-bench:A end -->\n\n## Where zeroserve falls short\n\n- A: slow\n"
    out = merge(existing, {"B": Section("B", "## B", "### B part")})
    assert out.index("zeroserve-bench:B end") < out.index("## Where zeroserve falls short")
    assert out.endswith("- A: slow\n")
