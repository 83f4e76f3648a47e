"""The layering of docs/architecture.md, checked from the source with ``ast``: packages
import only downward, no module takes part in an import cycle, and the product never
imports the benchmarks."""

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
    "models": {"errors", "http"},
    "runtime": {"errors", "metrics", "models"},
    # The gateway's sockets; configured by the remote model's parsed options (models/remote.py).
    "upstream": {"http", "errors", "metrics", "models"},
    "edge": {"errors", "metrics"},
    "app": {"runtime", "errors", "metrics", "models", "http", "upstream", "edge"},
    "server": {"http", "app", "runtime", "errors", "metrics", "models", "edge"},
    # The load generator is a client: it imports nothing of the server.
    "loadgen": {"errors"},
    "config": {"errors", "http", "runtime", "server", "models", "metrics", "edge", "app"},
    "cli": {
        "__init__",
        "config",
        "errors",
        "models",
        "server",
        "loadgen",
        "runtime",
        "app",
        "http",
        "metrics",
        "edge",
        "buildinfo",
    },
    # Which build runs (pure or compiled); imports nothing internal, never compiled.
    "buildinfo": set(),
    "__init__": {"errors", "models", "buildinfo"},
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
                        is_module = (PKG / alias.name).is_dir() or (
                            PKG / f"{alias.name}.py"
                        ).exists()
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
    assert layer in ALLOWED, f"{layer} is not a known layer: add it to the architecture's table"
    bad = _internal_imports(path) - ALLOWED[layer] - {layer}
    assert not bad, f"{path.relative_to(PKG)} ({layer}) imports {sorted(bad)}"


def test_public_exports() -> None:
    import zeroserve

    assert set(zeroserve.__all__) == {
        "GenerateRequest",
        "Model",
        "TensorSpec",
        "ZeroserveError",
        "__version__",
    }
    for name in zeroserve.__all__:
        assert hasattr(zeroserve, name)


# -- import cycles -------------------------------------------------------------------------
# Cycles tolerated while a branch that removes them is merged (each with its reason).
# Empty: none is. The list only shrinks (test_allowed_cycles_still_exist).
ALLOWED_CYCLES: list[frozenset[str]] = []


def _module_name(path: Path) -> str:
    rel = path.relative_to(PKG.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _is_module(name: str) -> bool:
    rel = Path(*name.split("."))
    base = PKG.parent / rel
    return base.is_dir() or base.with_suffix(".py").exists()


def _imported_modules(path: Path) -> set[str]:
    """Every zeroserve module ``path`` imports, anywhere in it: at the top, inside functions
    (lazy) and under ``TYPE_CHECKING``. ``from PKG import NAME`` counts NAME when it is a
    module of PKG, else PKG."""
    here = _module_name(path).split(".")
    package = here if path.name == "__init__.py" else here[:-1]
    return _imports_in(path.read_text(), package)


def _imports_in(source: str, package: list[str]) -> set[str]:
    tree = ast.parse(source)
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] in ("zeroserve", "benchmarks"):
                    found.add(alias.name)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - (node.level - 1)]
                target = ".".join([*base, *(node.module.split(".") if node.module else [])])
            else:
                target = node.module or ""
            if target.split(".")[0] not in ("zeroserve", "benchmarks"):
                continue
            subs = [f"{target}.{a.name}" for a in node.names if _is_module(f"{target}.{a.name}")]
            found.update(subs)
            if len(subs) < len(node.names):
                found.add(target)
    return found


def _import_graph() -> dict[str, set[str]]:
    graph = {_module_name(p): _imported_modules(p) for p in SOURCES}
    return {mod: {t for t in targets if t in graph and t != mod} for mod, targets in graph.items()}


def _cycles(graph: dict[str, set[str]]) -> list[frozenset[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[frozenset[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component: set[str] = set()
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.add(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(frozenset(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_no_import_cycles() -> None:
    cycles = [c for c in _cycles(_import_graph()) if c not in ALLOWED_CYCLES]
    assert not cycles, "import cycles: " + "; ".join(" <-> ".join(sorted(c)) for c in cycles)


def test_the_cycle_check_finds_lazy_and_type_only_cycles() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": set()}
    assert _cycles(graph) == [frozenset({"a", "b", "c"})]
    # Imports under TYPE_CHECKING and inside functions are edges too.
    source = (
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n    from .pool import Connection\n"
        "def later():\n    from ..runtime import engine\n"
    )
    found = _imports_in(source, ["zeroserve", "upstream"])
    assert {"zeroserve.upstream.pool", "zeroserve.runtime.engine"} <= found


def test_allowed_cycles_still_exist() -> None:
    """An allowance for a cycle that is gone must go too (the list only shrinks)."""
    cycles = set(_cycles(_import_graph()))
    stale = [c for c in ALLOWED_CYCLES if c not in cycles]
    assert not stale, "remove from ALLOWED_CYCLES: " + "; ".join(
        " <-> ".join(sorted(c)) for c in stale
    )


@pytest.mark.parametrize("path", SOURCES, ids=[str(p.relative_to(PKG)) for p in SOURCES])
def test_the_product_never_imports_the_benchmarks(path: Path) -> None:
    bad = sorted(m for m in _imported_modules(path) if m.split(".")[0] == "benchmarks")
    assert not bad, f"{path.relative_to(PKG)} imports {bad}"
