"""``python -m benchmarks`` (``make bench``): run the suites of the catalog, merge their
sections into the report.

Every suite starts its own servers fresh, pinned apart from its load, and stops them by
PID; loops are bounded by rounds, cases and servers, each measurement by its duration
plus fixed slack. One broken suite does not lose the others' results. Ctrl-C (or SIGTERM)
stops the running measurement's servers and writes what completed.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import shlex
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

from . import machine
from .context import SuiteContext
from .report import Section, merge
from .servers import BASELINE_SRC_ENV, ECHO
from .suites import SUITES

# A new report starts with this; an existing one keeps its hand-written text.
PREAMBLE = """# Benchmarks

Reproduce every number below with `make bench`, or one suite with `python -m benchmarks
--suites W3` (`python -m benchmarks --help`). Each suite rewrites only its own part,
between its `zeroserve-bench` markers; each part's footer names the machine it ran on.
"""
# Options that say where results go, not what is measured: left out of "Reproduce".
_OUTPUT_OPTIONS = ("--out", "--results-dir")
# Suites whose load is the harness's own clients; every other one drives wrk.
WITHOUT_WRK = frozenset({"W5", "W6", "W7", "tinyllm", "priorities", "cycles", "images"})


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m benchmarks",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--suites",
        default=",".join(SUITES),
        help="comma-separated suite ids (default: all, %(default)s)",
    )
    p.add_argument(
        "--quick",
        action="store_true",
        help="a tiny run (one short round, fewer cases) for smoke tests",
    )
    p.add_argument(
        "--out",
        type=Path,
        default=Path("BENCHMARKS.md"),
        help="Markdown report to merge into (default: %(default)s)",
    )
    p.add_argument(
        "--results-dir",
        type=Path,
        default=Path("bench-results"),
        help="plots, raw JSON and logs (default: %(default)s)",
    )
    p.add_argument(
        "--servers",
        default=None,
        help="W1/W2: comma-separated server names (default: every one that can "
        "run: zeroserve, fastapi, granian, aiohttp); cycles: the kinds to cycle "
        "(default: all, inline,thread,process,ray,ray-serve,llamacpp,llamacpp-process)",
    )
    p.add_argument(
        "--zeroserve-args",
        default=shlex.join(["--model", ECHO]),
        help="W1/W2: arguments for `zeroserve serve` after --host/--port, one "
        "shell-quoted string (default: %(default)r)",
    )
    p.add_argument("--duration", type=int, default=None, help="seconds of load per measurement")
    p.add_argument("--warmup", type=int, default=None, help="seconds of warm-up load")
    p.add_argument("--rounds", type=int, default=None, help="interleaved rounds")
    p.add_argument("--no-strace", action="store_true", help="W2: skip write-syscall counting")
    return p


def _interruptible() -> Callable[[], None]:
    """Make SIGTERM and SIGINT raise KeyboardInterrupt (even where a background shell
    ignored SIGINT), so every started server is stopped on the way out. Returns the undo."""
    if threading.current_thread() is not threading.main_thread():
        return lambda: None

    def interrupt(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    saved = {sig: signal.signal(sig, interrupt) for sig in (signal.SIGTERM, signal.SIGINT)}

    def undo() -> None:
        for sig, handler in saved.items():
            signal.signal(sig, handler)

    return undo


def reproduce(given: list[str], base_src: str | None) -> str:
    """The command line a report gives to repeat this run: ``make bench`` for a run with
    no arguments, else ``python -m benchmarks`` with what was measured. Where results go
    (``--out``, ``--results-dir``) is left out, and a baseline tree is named by its
    commit, never by its path on this machine."""
    args: list[str] = []
    skip = False
    for arg in given:
        if skip:
            skip = False
        elif arg in _OUTPUT_OPTIONS:
            skip = True
        elif not arg.startswith(tuple(f"{o}=" for o in _OUTPUT_OPTIONS)):
            args.append(arg)
    command = (
        "python -m benchmarks " + " ".join(shlex.quote(a) for a in args)
        if args
        else ("python -m benchmarks" if given else "make bench")
    )
    if base_src:
        command = f"{BASELINE_SRC_ENV}={describe_tree(base_src)} {command}"
    return command


def describe_tree(src: str) -> str:
    """A baseline ``src/`` as words that hold on any machine: ``<a checkout of COMMIT,
    compiled>/src`` (its git commit, and whether it holds a compiled build)."""
    path = Path(src)
    try:
        commit = subprocess.run(
            ["git", "-C", str(path), "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        commit = ""
    what = f"a checkout of {commit}" if commit else "another checkout"
    if (path / "zeroserve" / "_compiled.json").exists():
        what += ", compiled"
    return f"<{what}>/src" if path.name == "src" else f"<{what}>"


def main(argv: list[str] | None = None) -> int:
    """Run the selected suites and merge their sections into ``--out``. Returns the exit
    status: 0 when every suite ran, 1 when one failed, 2 for bad arguments or no wrk."""
    args = _parser().parse_args(argv)
    wanted = [s.strip() for s in args.suites.split(",") if s.strip()]
    unknown = [s for s in wanted if s not in SUITES]
    if unknown or not wanted:
        print(f"benchmarks: unknown suites {unknown}; known: {', '.join(SUITES)}", file=sys.stderr)
        return 2
    if shutil.which("wrk") is None and set(wanted) - WITHOUT_WRK:
        print(
            "benchmarks: wrk not found; install it with `make bench-tools` "
            "(apt-get install wrk nghttp2-client strace)",
            file=sys.stderr,
        )
        return 2
    given = sys.argv[1:] if argv is None else argv
    pins = machine.Pinning.detect()
    # An A/B against another checkout is part of how to reproduce the run.
    ctx = SuiteContext(
        quick=args.quick,
        results_dir=args.results_dir,
        pins=pins,
        command=reproduce(list(given), os.environ.get(BASELINE_SRC_ENV)),
        # Taken before the harness pins itself to one CPU.
        machine=tuple(machine.facts()),
        rounds=args.rounds,
        duration_s=args.duration,
        warmup_s=args.warmup,
        count_writes=not args.no_strace,
        servers=tuple(s.strip() for s in args.servers.split(",")) if args.servers else None,
        zeroserve_args=tuple(shlex.split(args.zeroserve_args)),
    )
    args.results_dir.mkdir(parents=True, exist_ok=True)
    done: dict[str, Section] = {}
    failed = 0
    restore = _interruptible()
    try:
        with machine.harness_on_load_cpu(pins):
            for sid in wanted:
                t0 = time.monotonic()
                print(f"benchmarks: {sid} ...", flush=True)
                try:
                    part = dataclasses.replace(ctx, cpu_at_start=machine.CpuTimes.read())
                    done[sid] = SUITES[sid](part)
                except Exception as exc:  # one broken suite must not lose the others
                    failed += 1
                    print(f"benchmarks: {sid} failed: {type(exc).__name__}: {exc}", file=sys.stderr)
                    continue
                print(done[sid].markdown, flush=True)
                print(f"benchmarks: {sid} done in {time.monotonic() - t0:.0f} s", flush=True)
    except KeyboardInterrupt:
        print("benchmarks: interrupted; writing the suites completed so far", file=sys.stderr)
        failed += 1
    finally:
        restore()
    if done:
        existing = args.out.read_text() if args.out.exists() else PREAMBLE
        args.out.write_text(merge(existing, done))
        print(f"benchmarks: wrote {', '.join(done)} into {args.out}", flush=True)
    return 0 if done and not failed else 1
