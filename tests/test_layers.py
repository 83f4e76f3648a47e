"""The layering of DESIGN.md §2, checked from the source with ``ast``: packages import
only downward."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parents[1] / "src" / "zeroserve"

# layer -> internal layers it may import
ALLOWED: dict[str, set[str]] = {
    "errors": set(),
    "metrics": set(),
    "http": {"errors", "metrics"},
    "models": {"errors"},
    "runtime": {"errors", "metrics", "models"},
    # The gateway's sockets; configured by the remote model's parsed options (models/remote.py).
    "upstream": {"http", "errors", "metrics", "models"},
    "app": {"runtime", "errors", "metrics", "models", "http", "upstream"},
    "server": {"http", "app", "runtime", "errors", "metrics", "models"},
    # The load generator is a client: it imports nothing of the server.
    "loadgen": set(),
    "config": {"errors", "http", "runtime", "server", "models", "metrics"},
    "cli": {"__init__", "config", "errors", "models", "server", "loadgen", "runtime", "app", "http", "metrics"},
    "__init__": {"errors", "models"},
    "__main__": {"cli"},
}


def _layer(path: Path) -> str:
    rel = path.relative_to(PKG)
    return rel.parts[0].removesuffix(".py")


def _internal_imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), str(path))
    depth = len(path.relative_to(PKG).parts) - 1  # package depth of the module
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                up = node.level - 1
                if up < depth:  # stays inside its own top-level package
                    continue
                target = (node.module or "").split(".")[0]
                if target:
                    found.add(target)
                else:
                    for alias in node.names:
                        is_module = (PKG / alias.name).is_dir() or (PKG / f"{alias.name}.py").exists()
                        found.add(alias.name if is_module else "__init__")
            elif node.module and node.module.startswith("zeroserve"):
                parts = node.module.split(".")
                found.add(parts[1] if len(parts) > 1 else "__init__")
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith("zeroserve."):
                    found.add(alias.name.split(".")[1])
    return found


SOURCES = sorted(p for p in PKG.rglob("*.py"))


@pytest.mark.parametrize("path", SOURCES, ids=[str(p.relative_to(PKG)) for p in SOURCES])
def test_imports_go_only_downward(path: Path) -> None:
    layer = _layer(path)
    assert layer in ALLOWED, f"{layer} is not a known layer: add it to DESIGN's table"
    bad = _internal_imports(path) - ALLOWED[layer] - {layer}
    assert not bad, f"{path.relative_to(PKG)} ({layer}) imports {sorted(bad)}"


def test_public_exports() -> None:
    import zeroserve

    assert set(zeroserve.__all__) == {"GenerateRequest", "Model", "TensorSpec", "ZeroserveError", "__version__"}
    for name in zeroserve.__all__:
        assert hasattr(zeroserve, name)
