"""Benchmark suites that drive their own servers and clients (beyond wrk's scenarios).

A suite is a function ``(SuiteContext) -> Section``, registered under an id in
:data:`SUITES`. A suite module registers itself with one line, e.g.
``SUITES["W5"] = w5`` (and is imported at the bottom of this file). Each
:class:`Section` names its ``group``; a group's parts are written into the report between
``<!-- zeroserve-bench:GROUP begin -->`` and ``<!-- zeroserve-bench:GROUP end -->``, one
part per suite inside its own inner markers, so rerunning some suites replaces their parts
and keeps the others (and everything outside the markers).

Run: ``python -m zeroserve.bench.suites --suites W5,W6 [--quick] [--out BENCHMARKS.md]``.
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from ..procs import cpu_count

SERVER_CPU = 0
LOAD_CPU = 1


@dataclass(frozen=True)
class SuiteContext:
    quick: bool
    results_dir: Path
    server_cpu: int | None   # None: fewer than 2 CPUs, nothing pinned
    load_cpu: int | None
    command: str              # how to reproduce this run
    # Date, machine, software lines (taken before the harness pins itself to one CPU).
    machine: tuple[str, ...] = ()


@dataclass(frozen=True)
class Section:
    group: str        # marker name, e.g. "W5-W8"
    title: str        # the group's heading, used when the group is new in the file
    markdown: str     # this suite's part (starts with its own ### heading)


Suite = Callable[[SuiteContext], Section]
SUITES: dict[str, Suite] = {}


def _marks(name: str) -> tuple[str, str]:
    return f"<!-- zeroserve-bench:{name} begin -->", f"<!-- zeroserve-bench:{name} end -->"


def _between(text: str, name: str) -> tuple[int, int, str] | None:
    """(start, end, inner text) of the block ``name`` in ``text``, or None."""
    begin, end = _marks(name)
    i = text.find(begin)
    j = text.find(end, i + len(begin)) if i >= 0 else -1
    if i < 0 or j < 0:
        return None
    return i, j + len(end), text[i + len(begin):j]


def merge(existing: str, sections: dict[str, Section]) -> str:
    """Write each suite's part into its group's block of ``existing``; keep the rest."""
    out = existing
    for group in dict.fromkeys(s.group for s in sections.values()):
        mine = {sid: s for sid, s in sections.items() if s.group == group}
        found = _between(out, group)
        inner = found[2] if found else ""
        # Parts already in the block, in their order; rerun suites replace theirs.
        parts: dict[str, str] = {}
        pos = 0
        while (k := inner.find("<!-- zeroserve-bench:" + group + "/", pos)) >= 0:
            sid = inner[k:].split("/", 1)[1].split(" ", 1)[0]
            block = _between(inner[k:], f"{group}/{sid}")
            if block is None:
                break
            parts[sid] = block[2].strip("\n")
            pos = k + block[1]
        for sid, sec in mine.items():
            parts[sid] = sec.markdown.strip("\n")
        title = next(iter(mine.values())).title
        if found:
            head = inner.split("<!-- zeroserve-bench:" + group + "/", 1)[0].strip("\n")
        else:
            head = title
        body = [head, ""]
        for sid, part in parts.items():
            b, e = _marks(f"{group}/{sid}")
            body += [b, part, e, ""]
        begin, end = _marks(group)
        text = "\n".join([begin, *body, end])
        if found:
            out = out[:found[0]] + text + out[found[1]:]
        else:
            out = out.rstrip("\n") + ("\n\n" if out.strip() else "") + text + "\n"
    return out


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m zeroserve.bench.suites", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--suites", default=",".join(SUITES),
                   help="comma-separated suite ids (default: %(default)s)")
    p.add_argument("--quick", action="store_true", help="a few seconds per scenario")
    p.add_argument("--out", type=Path, default=Path("BENCHMARKS.md"))
    p.add_argument("--results-dir", type=Path, default=Path("bench-results"),
                   help="logs and raw JSON (default: %(default)s)")
    return p


def main(argv: list[str] | None = None) -> int:
    """Run the selected suites and merge their sections into ``--out``."""
    args = _parser().parse_args(argv)
    wanted = [s.strip() for s in args.suites.split(",") if s.strip()]
    unknown = [s for s in wanted if s not in SUITES]
    if unknown or not wanted:
        print(f"suites: unknown {unknown}; known: {', '.join(SUITES)}", file=sys.stderr)
        return 2
    pinned = cpu_count() >= 2 and {SERVER_CPU, LOAD_CPU} <= os.sched_getaffinity(0)
    given = sys.argv[1:] if argv is None else argv
    from ..cli import _machine  # the wrk report's machine lines

    ctx = SuiteContext(
        quick=args.quick, results_dir=args.results_dir,
        server_cpu=SERVER_CPU if pinned else None, load_cpu=LOAD_CPU if pinned else None,
        command="python -m zeroserve.bench.suites " + " ".join(shlex.quote(a) for a in given),
        machine=tuple(_machine()),
    )
    args.results_dir.mkdir(parents=True, exist_ok=True)
    original = os.sched_getaffinity(0)
    if pinned:  # the harness (clients, probes, samplers) stays off the server's core
        os.sched_setaffinity(0, {LOAD_CPU})
    done: dict[str, Section] = {}
    failed = 0
    try:
        for sid in wanted:
            t0 = time.monotonic()
            print(f"suites: {sid} ...", flush=True)
            try:
                done[sid] = SUITES[sid](ctx)
            except Exception as exc:  # one broken suite must not lose the others' results
                failed += 1
                print(f"suites: {sid} failed: {type(exc).__name__}: {exc}", file=sys.stderr)
                continue
            print(done[sid].markdown, flush=True)
            print(f"suites: {sid} done in {time.monotonic() - t0:.0f} s", flush=True)
    except KeyboardInterrupt:
        print("suites: interrupted; writing the suites completed so far", file=sys.stderr)
        failed += 1
    finally:
        os.sched_setaffinity(0, original)
    if done:
        existing = args.out.read_text() if args.out.exists() else ""
        args.out.write_text(merge(existing, done))
        print(f"suites: wrote {', '.join(done)} into {args.out}", flush=True)
    return 0 if done and not failed else 1


# Suite modules register into SUITES when imported (one line each).
from . import runtime  # noqa: E402, F401, I001
from . import api  # noqa: E402, F401
