"""P64: a 64 MiB raw body through ``echo``, the process executor against inline: the
copies it costs and the throughput it keeps."""

from __future__ import annotations

import contextlib
import json
import os

from ..context import SuiteContext
from ..report import Section, cpu, fixed, footer, mark, p, peak_rss, rps
from ..runner import run_grid
from ..scenarios import Case, Validator
from ..servers import zeroserve
from ._runtime import GROUP, TITLE, MiB

P64_BYTES = 64 * MiB
P64_COPY_TARGET = 0.02
P64_RATIO_TARGET = 0.8
# (rounds, seconds, warm-up seconds): a 64 MiB echo takes tens of ms, so 5 s is plenty.
FULL = (3, 5, 1)
QUICK = (1, 2, 0)


def _p64_check(body_len: int) -> Validator:
    def check(status: int, headers: dict[str, str], resp: bytes) -> str | None:
        if status != 200:
            return f"status {status}"
        if len(resp) != body_len:
            return f"echo mismatch: sent {body_len} bytes, got {len(resp)}"
        return None

    return check


def p64(ctx: SuiteContext) -> Section:
    settings = ctx.settings(full=FULL, quick=QUICK)
    conns = 1 if ctx.quick else 2
    body = os.urandom(P64_BYTES)
    case = Case(
        key="P64",
        scenario="P64",
        label="64 MiB",
        kind="echo",
        path="/v1/raw/echo",
        body=body,
        headers={"Content-Type": "application/octet-stream"},
        connections=conns,
        validate=_p64_check(len(body)),
        min_duration_s=settings.duration_s,
    )
    specs = [
        zeroserve(
            f"echo=zeroserve.models.echo:EchoModel?executor={ex}",
            name=f"zeroserve-{ex}",
            title=f"zeroserve {ex}",
        )
        for ex in ("inline", "process")
    ]
    grid = run_grid(specs, [case], settings)
    with contextlib.suppress(OSError):
        (ctx.results_dir / "work" / "P64.body").unlink()
    (ctx.results_dir / "runtime-P64.json").write_text(
        json.dumps(grid.to_json(), indent=1, default=str)
    )
    lines = [
        "### P64: a 64 MiB raw body through echo, process executor vs inline",
        "",
        f"`POST /v1/raw/echo` with a 64 MiB body, wrk with {conns} connection(s) for "
        f"{settings.duration_s} s, {settings.rounds} interleaved round(s), medians. Copies: "
        "`zeroserve_copied_bytes_total` (all sites) ÷ `zeroserve_payload_bytes_total"
        '{direction="in"}` over the measured window.',
        "",
        "| executor | req/s | MB/s (in) | p50 / p99 ms | CPU ms/req | peak RSS MiB | copied % "
        "of payload in | copies by site | errors |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for spec in specs:
        k, n = case.key, spec.name
        good = grid.ok(k, n)
        if not good:
            lines.append(f"| {n} | {grid.why(k, n)} ||||||||")
            continue
        sites = grid.copied_sites(k, n)
        rate = grid.med(k, n, rps)
        lines.append(
            f"| {n.removeprefix('zeroserve-')} | {fixed(rate, 2)} | {fixed(rate * P64_BYTES / 1e6)} | "
            f"{fixed(grid.med(k, n, p(50)))} / {fixed(grid.med(k, n, p(99)))} | "
            f"{fixed(grid.med(k, n, cpu))} | {fixed(grid.med(k, n, peak_rss))} | "
            f"{fixed(grid.copied_pct(k, n), 3)}% | "
            + (", ".join(f"{s}={v / 1e6:.1f} MB" for s, v in sorted(sites.items()) if v) or "none")
            + f" | {sum(run.wrk_errors for run in grid.runs.get((k, n), []))} |"
        )
    targets = []
    if grid.ok(case.key, "zeroserve-process"):
        share = grid.copied_pct(case.key, "zeroserve-process") / 100
        targets.append(
            f"- copies ≤{100 * P64_COPY_TARGET:g}% of payload (process): "
            f"{fixed(100 * share, 3)}% — {mark(share <= P64_COPY_TARGET)}"
        )
    if grid.ok(case.key, "zeroserve-process") and grid.ok(case.key, "zeroserve-inline"):
        ratio = grid.ratio(case.key, "zeroserve-process", "zeroserve-inline", rps)
        targets.append(
            f"- process ≥{P64_RATIO_TARGET}x inline throughput: {fixed(ratio, 2)}x "
            f"(median of per-round ratios, same run) — "
            f"{mark(ratio >= P64_RATIO_TARGET)}"
        )
    return Section(GROUP, TITLE, "\n".join([*lines, "", *targets, *footer(ctx, settings)]))
