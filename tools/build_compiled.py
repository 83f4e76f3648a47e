"""Build (or remove) zeroserve's compiled hot path in place: ``make install`` runs it (``make compiled``).

    python tools/build_compiled.py          # compile, unless up to date, pure or no compiler
    python tools/build_compiled.py --clean  # remove every compiled artifact

The modules are ``zeroserve.buildinfo.COMPILED_MODULES``, compiled by mypyc into C
extensions next to their sources in ``src/`` (so an editable install and
``PYTHONPATH=src`` both import them), plus ``src/zeroserve/_compiled.json``, the
manifest of the sources they were built from, which ``buildinfo.guard()`` checks at
import (docs/decisions/0007-compiled-build.md). ``ZEROSERVE_PURE=1``, or no C
compiler, or no mypyc, leaves a pure-Python tree and says so in one line.
"""

from __future__ import annotations

import argparse
import importlib.machinery
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "src"


def _buildinfo() -> ModuleType:
    """``zeroserve/buildinfo.py`` alone: it imports nothing of zeroserve's, and importing
    the package would run its import guard and pull in numpy."""
    spec = importlib.util.spec_from_file_location(
        "_zeroserve_buildinfo", SRC / "zeroserve" / "buildinfo.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


buildinfo = _buildinfo()
GROUP = "zeroserve"  # the shared library: src/zeroserve__mypyc.<suffix>
# gcc's parallel jobs: one per module file (mypyc's multi_file), bounded by the CPUs.
JOBS = max(1, min(len(buildinfo.COMPILED_MODULES), os.cpu_count() or 1))


def artifacts() -> list[Path]:
    # Every extension module in the package is this build's (zeroserve has no other C
    # code), including those of modules since dropped from COMPILED_MODULES: left behind,
    # one would shadow its source and fail to load against the new shared library.
    found = _extensions() + sorted(SRC.glob(f"{GROUP}__mypyc.*"))
    manifest = buildinfo.PACKAGE_DIR / buildinfo.MANIFEST
    return [*found, manifest] if manifest.exists() else found


def _extensions() -> list[Path]:
    suffixes = tuple(importlib.machinery.EXTENSION_SUFFIXES)
    return sorted(p for p in buildinfo.PACKAGE_DIR.rglob("*") if p.name.endswith(suffixes))


def clean() -> None:
    for path in artifacts():
        path.unlink()


def compiler() -> str | None:
    cc = (os.environ.get("CC") or sysconfig.get_config_var("CC") or "cc").split()[0]
    return shutil.which(cc)


def up_to_date(mypy_version: str) -> bool:
    manifest = buildinfo.PACKAGE_DIR / buildinfo.MANIFEST
    try:
        doc = json.loads(manifest.read_text())
    except (FileNotFoundError, ValueError):
        return False
    expected = {m: buildinfo.source_digest(m) for m in buildinfo.COMPILED_MODULES}
    built = {m: buildinfo.extension_paths(m) for m in expected}
    return (
        doc.get("mypy") == mypy_version
        and doc.get("modules") == expected
        and all(built.values())
        # and no extension left by a module since dropped from the list
        and set(_extensions()) == {p for paths in built.values() for p in paths}
    )


def build(mypy_version: str) -> None:
    # A scratch build directory: build_ext --inplace copies only the extensions into src/.
    with tempfile.TemporaryDirectory(prefix="zeroserve-mypyc-") as tmp:
        script = (
            "import sys\n"
            "from setuptools import setup\n"
            "from mypyc.build import mypycify\n"
            f"sys.argv[1:] = ['build_ext', '--inplace', '--parallel', '{JOBS}',"
            f" '--build-temp', {str(Path(tmp, 'temp'))!r}, '--build-lib', {str(Path(tmp, 'lib'))!r}]\n"
            "setup(name='zeroserve-compiled', package_dir={'': 'src'}, py_modules=[],\n"
            f"      ext_modules=mypycify({[str(buildinfo.source_path(m).relative_to(ROOT)) for m in buildinfo.COMPILED_MODULES]!r},\n"
            f"          opt_level='3', debug_level='0', multi_file=True, group_name={GROUP!r},\n"
            f"          target_dir={str(Path(tmp, 'c'))!r}))\n"
            # Skip the interpreter's final collection of mypy's object graph (minutes).
            "sys.stdout.flush(); sys.stderr.flush(); import os; os._exit(0)\n"
        )
        env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
        done = subprocess.run(
            [sys.executable, "-c", script], cwd=ROOT, env=env, capture_output=True, text=True
        )
        if done.returncode != 0:
            sys.stdout.write(done.stdout[-4000:])
            sys.stderr.write(done.stderr[-4000:])
            clean()
            raise SystemExit(f"zeroserve: the mypyc build failed (exit {done.returncode})")
    digests = {m: buildinfo.source_digest(m) for m in buildinfo.COMPILED_MODULES}
    (buildinfo.PACKAGE_DIR / buildinfo.MANIFEST).write_text(
        json.dumps({"mypy": mypy_version, "modules": digests}, indent=1, sort_keys=True) + "\n"
    )


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--clean", action="store_true", help="remove the compiled build")
    args = p.parse_args()
    if args.clean:
        clean()
        return 0
    if os.environ.get(buildinfo.PURE_ENV) == "1":
        clean()
        print("zeroserve: pure Python build (ZEROSERVE_PURE=1)")
        return 0
    if compiler() is None:
        clean()
        print("zeroserve: no C compiler found: pure Python build (the hot path is not compiled)")
        return 0
    try:
        from mypy.version import __version__ as mypy_version
    except ImportError:
        clean()
        print("zeroserve: mypyc (mypy) is not installed: pure Python build")
        return 0
    names = ", ".join(m.removeprefix("zeroserve.") for m in buildinfo.COMPILED_MODULES)
    if up_to_date(mypy_version):
        print(f"zeroserve: compiled build up to date ({names})")
        return 0
    clean()
    print(f"zeroserve: compiling the hot path with mypyc {mypy_version} ({names}) ...", flush=True)
    build(mypy_version)
    print("zeroserve: compiled build installed")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
