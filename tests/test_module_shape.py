"""The shape the house keeps (docs/architecture.md, "Layers"): no module over 600 lines, and
no two classes of one name anywhere in the package, so a name found in a traceback or a
review is one class."""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

PKG = Path(__file__).resolve().parents[1] / "src" / "zeroserve"
MAX_LINES = 600


def _modules() -> list[Path]:
    return sorted(p for p in PKG.rglob("*.py") if "__pycache__" not in p.parts)


def test_no_module_is_over_600_lines() -> None:
    long = {
        str(p.relative_to(PKG)): n
        for p in _modules()
        if (n := len(p.read_text().splitlines())) > MAX_LINES
    }
    assert long == {}


def test_no_two_classes_share_a_name() -> None:
    where: dict[str, list[str]] = defaultdict(list)
    for path in _modules():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef):
                where[node.name].append(f"{path.relative_to(PKG)}:{node.lineno}")
    shared = {name: places for name, places in where.items() if len(places) > 1}
    assert shared == {}
