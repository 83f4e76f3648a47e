"""The harness's boundaries, checked from the source with ``ast``: ``benchmarks/`` imports
from zeroserve only the public Model API (``zeroserve`` and ``zeroserve.models``: the
Model base, its request types, the built-in models), except the scripts that time the
gateway's own upstream client, the edge's key check and the class queue; nothing under ``src/`` imports
``benchmarks``; and the wheel's package list does not include it."""

from __future__ import annotations

import ast
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
HARNESS = ROOT / "benchmarks"
PUBLIC = ("zeroserve", "zeroserve.models")
# Time the gateway's pooled upstream client in-process against aiohttp and httpx, and the
# edge's API-key check in-process, and a chat image's path from the body to the engine's
# request (each in a process of its own; the harness reads output).
INTERNAL_ALLOWED = {
    HARNESS / "scripts" / "measure_overhead.py",
    HARNESS / "scripts" / "edge_key_cost.py",
    HARNESS / "scripts" / "class_queue_cost.py",
    HARNESS / "scripts" / "image_decode.py",
}


def _imports(path: Path) -> set[str]:
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom) and node.module and not node.level:
            found.add(node.module)
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
    return found


def test_the_harness_uses_only_the_public_model_api() -> None:
    bad = {}
    for path in sorted(HARNESS.rglob("*.py")):
        if path in INTERNAL_ALLOWED:
            continue
        private = {
            m
            for m in _imports(path)
            if m.split(".")[0] == "zeroserve"
            and not any(m == p or m.startswith("zeroserve.models.") for p in PUBLIC)
        }
        if private:
            bad[str(path.relative_to(ROOT))] = sorted(private)
    assert not bad, bad


def test_the_product_never_imports_the_harness() -> None:
    bad = [
        str(p.relative_to(ROOT))
        for p in sorted((ROOT / "src").rglob("*.py"))
        if any(m.split(".")[0] == "benchmarks" for m in _imports(p))
    ]
    assert not bad, bad


def test_the_wheel_ships_only_the_product() -> None:
    find = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"][
        "find"
    ]
    assert find["where"] == ["src"] and find["include"] == ["zeroserve*"]
    assert not (ROOT / "src" / "benchmarks").exists()
