"""``zeroserve --version`` names the build that really runs, and a compiled build whose
sources changed never shadows them (docs/decisions/0007-compiled-build.md).

``make pytest`` sets ``ZEROSERVE_TEST_BUILD`` to the build it meant to test (``compiled``
after ``make compiled``, ``pure`` for the ``ZEROSERVE_PURE=1`` run), so a
compiled run that silently fell back to the sources fails here."""

from __future__ import annotations

import ast
import functools
import importlib.machinery
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path

import pytest

from tests.support import scaled
from zeroserve import buildinfo

SRC = Path(buildinfo.__file__).resolve().parents[1]
EXPECTED = os.environ.get("ZEROSERVE_TEST_BUILD")  # "compiled" | "pure" | None (anything)
TIMEOUT_S = scaled(60)  # one interpreter start importing the server

# Prints, as JSON, the file each compiled module was really loaded from.
_ORIGINS = (
    "import importlib, json, sys\n"
    "from zeroserve import buildinfo\n"
    "print(json.dumps({m: importlib.import_module(m).__file__"
    " for m in buildinfo.COMPILED_MODULES}))\n"
)


def _run(args: list[str], env: Mapping[str, str]) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(
        [sys.executable, *args], env=dict(env), capture_output=True, text=True, timeout=TIMEOUT_S
    )
    assert done.returncode == 0, done.stderr
    return done


def _version(env: Mapping[str, str]) -> str:
    return _run(["-m", "zeroserve", "--version"], env).stdout.strip()


def _origins(env: Mapping[str, str]) -> dict[str, str]:
    origins: dict[str, str] = json.loads(_run(["-c", _ORIGINS], env).stdout)
    return origins


def _compiled(origins: Mapping[str, str]) -> list[str]:
    suffixes = tuple(importlib.machinery.EXTENSION_SUFFIXES)
    return [m for m, path in origins.items() if path.endswith(suffixes)]


def _claimed(version: str) -> list[str]:
    """The modules a --version line says are compiled."""
    _, sep, listed = version.partition("(compiled with mypyc: ")
    if not sep:
        return []
    return ["zeroserve." + m for m in listed.removesuffix(")").split(", ")]


def test_version_names_the_modules_really_loaded_compiled() -> None:
    env = dict(os.environ)
    version = _version(env)
    compiled = _compiled(_origins(env))
    assert version.startswith("zeroserve ")
    assert _claimed(version) == compiled
    if not compiled:
        assert "(pure Python" in version
    if EXPECTED == "compiled":
        assert compiled == list(buildinfo.COMPILED_MODULES), version
    elif EXPECTED == "pure":
        assert compiled == [], version


def test_pure_switch_loads_every_source() -> None:
    env = {**os.environ, buildinfo.PURE_ENV: "1"}
    origins = _origins(env)
    assert all(path.endswith(".py") for path in origins.values()), origins
    assert _version(env).endswith(f"(pure Python: {buildinfo.PURE_ENV}=1)")


def _compiled_copy(tmp_path: Path) -> Path:
    if buildinfo.read_manifest() is None:
        pytest.skip("needs the compiled build (`make compiled` with a C compiler)")
    dest = tmp_path / "src"
    shutil.copytree(
        SRC,
        dest,
        ignore=shutil.ignore_patterns("__pycache__", "*.safetensors", "*.gguf", "*.egg-info"),
    )
    return dest


def test_an_edited_source_is_never_shadowed_by_its_stale_extension(tmp_path: Path) -> None:
    src = _compiled_copy(tmp_path)
    env = {k: v for k, v in os.environ.items() if k != buildinfo.PURE_ENV}
    env["PYTHONPATH"] = str(src)
    # The copy as built loads its extensions (the test's premise).
    assert _compiled(_origins(env)) == list(buildinfo.COMPILED_MODULES)

    edited = src / "zeroserve" / "http" / "framing.py"
    edited.write_text(edited.read_text() + "\nEDITED_SINCE_THE_BUILD = True\n")
    done = _run(["-c", _ORIGINS], env)
    origins = json.loads(done.stdout)
    # One stale module makes all of them load from source: they call each other in C.
    assert _compiled(origins) == []
    assert origins["zeroserve.http.framing"] == str(edited)
    assert "stale compiled build" in done.stderr
    assert "zeroserve.http.framing" in done.stderr
    version = _run(["-W", "ignore::RuntimeWarning", "-m", "zeroserve", "--version"], env).stdout
    assert "pure Python: stale compiled build" in version
    assert "zeroserve.http.framing" in version

    (src / "zeroserve" / buildinfo.MANIFEST).unlink()
    assert _compiled(_origins(env)) == []
    assert f"without {buildinfo.MANIFEST}" in _version(env)


def _compiled_names(tree: ast.Module, this: str, package: str) -> set[str]:
    """The names module ``this`` of ``package`` (parsed: ``tree``) imports from compiled
    modules, directly or through a package that re-exports them (``from zeroserve.app
    import App``)."""
    names: set[str] = set()
    for node in ast.walk(tree):
        if not isinstance(node, ast.ImportFrom):
            continue
        parts = package.split(".")
        base = parts[: len(parts) - node.level + 1] if node.level else []
        module = ".".join([*base, *([node.module] if node.module else [])])
        if module in buildinfo.COMPILED_MODULES:
            names.update(a.asname or a.name for a in node.names)
        # (this != module: an __init__ importing from its own package is no re-export)
        elif module != this and module.startswith("zeroserve"):
            exported = _package_exports(module)
            names.update(a.asname or a.name for a in node.names if a.name in exported)
    return names


@functools.cache
def _package_exports(package: str) -> frozenset[str]:
    """What a package's ``__init__`` imports from compiled modules (empty for a module or a
    package without one). No recursion loop: the package graph has no import cycle
    (tests/test_layers.py)."""
    init = SRC / package.replace(".", "/") / "__init__.py"
    if not init.exists():
        return frozenset()
    return frozenset(_compiled_names(ast.parse(init.read_text()), package, package))


def test_no_interpreted_class_subclasses_a_compiled_one() -> None:
    # A compiled class is a native class: an interpreted subclass fails at import with
    # "interpreted classes cannot inherit from compiled" (in the compiled build only).
    compiled = set(buildinfo.COMPILED_MODULES)
    root = SRC.parent
    found: list[str] = []
    for path in [*(SRC / "zeroserve").rglob("*.py"), *(root / "tests").rglob("*.py")]:
        rel = path.relative_to(SRC if path.is_relative_to(SRC) else root).with_suffix("")
        module = ".".join(rel.parts).removesuffix(".__init__")
        if module in compiled:
            continue
        package = module if path.name == "__init__.py" else module.rpartition(".")[0]
        tree = ast.parse(path.read_text())
        imported = _compiled_names(tree, module, package)
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef):
                bases = [b.id for b in node.bases if isinstance(b, ast.Name)]
                found += [f"{module}.{node.name}({b})" for b in bases if b in imported]
    assert found == []


# -- what compiled code must not do ------------------------------------------------------
# mypyc keeps a compiled coroutine's handled exception in the thread's exception state,
# not in a frame of its own. A compiled coroutine that suspends inside an ``except`` or
# ``finally`` body leaves its exception there for whatever the loop runs next, and on
# resuming re-raises whatever is there then (docs/decisions/0009-no-await-in-handlers-when-compiled.md).
_SUSPENDS = (ast.Await, ast.AsyncFor, ast.AsyncWith, ast.Yield, ast.YieldFrom)


def _suspends_in_handlers(source: str) -> list[str]:
    """Each place in ``source`` that may suspend inside an ``except`` or ``finally`` body,
    and each ``async with`` (its exit is awaited in a handler when its body raises), as
    ``line: function``."""
    found: list[str] = []

    def visit(node: ast.AST, where: str, handler: bool) -> None:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda):
            name = getattr(node, "name", "<lambda>")
            for child in ast.iter_child_nodes(node):
                visit(child, name, False)  # a nested function has handlers of its own
            return
        if isinstance(node, ast.AsyncWith) or (handler and isinstance(node, _SUSPENDS)):
            found.append(f"{getattr(node, 'lineno', '?')}: {where}")
        if isinstance(node, ast.Try | ast.TryStar):
            for child in [*node.body, *node.orelse]:
                visit(child, where, handler)
            for child in [*node.handlers, *node.finalbody]:
                visit(child, where, True)
            return
        for child in ast.iter_child_nodes(node):
            visit(child, where, handler)

    visit(ast.parse(source), "<module>", False)
    return found


def test_no_compiled_module_suspends_inside_a_handler() -> None:
    for module in buildinfo.COMPILED_MODULES:
        path = SRC / (module.replace(".", "/") + ".py")
        assert _suspends_in_handlers(path.read_text()) == [], module


def test_the_handler_rule_sees_each_way_to_suspend() -> None:
    flagged = """
async def f(x):
    try:
        await x
    except ValueError:
        await x
    finally:
        async for _ in x:
            pass
    async with x:
        pass
    try:
        pass
    finally:
        def g():
            try:
                pass
            finally:
                yield
"""
    assert _suspends_in_handlers(flagged) == ["6: f", "8: f", "10: f", "19: g"]
    allowed = """
async def f(x):
    failure = None
    try:
        await x
        async for _ in x:
            pass
    except BaseException as exc:
        failure = exc
    try:
        pass
    finally:
        async def later():
            await x
    await x
    if failure is not None:
        raise failure
"""
    assert _suspends_in_handlers(allowed) == []
