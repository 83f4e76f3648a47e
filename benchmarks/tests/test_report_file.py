"""How a report says to reproduce a run: the command, without where results went, and a
baseline tree named by its commit, never by a path of the machine that ran it."""

from __future__ import annotations

import subprocess
from pathlib import Path

from benchmarks.cli import describe_tree, reproduce


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
