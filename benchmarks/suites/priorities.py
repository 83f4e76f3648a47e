"""Priority classes and the Batch API on one model (docs/priorities.md): ``smollm2`` on
llama.cpp's engine with ``PARALLEL`` slots, because its slots are where requests wait
(the step-batched ``tinyllm`` starts every stream at once: there is no wait for a class
to order, so it would show nothing). Three questions, one zeroserve per server setting:

(a) Interactive first-token p99 at ``CLIENTS`` concurrent chat streams alone, and with a
    batch of chat lines running on the same model; the same with classes off
    (``priority_aging_s = 0``: FIFO) beside it. Target: with the batch at most 1.5x alone.
(b) Batch throughput with nothing else on the model, against a saturating client's
    requests/s on the same model and the same request. Target: at least 90 %.
(c) Aging: a class-``LOW`` stream at a time under a continuous class-0 load of
    ``CLIENTS`` streams; its worst wait (its first token) against the bound decision 0036
    states: passed over by newcomers for at most ``LOW x aging_s``, then it waits only
    for the work already ahead, which ends within a class-0 request's own longest time.
"""

from __future__ import annotations

import asyncio
import json
import math
import time
from dataclasses import replace
from pathlib import Path

import httpx

from ..context import Settings, SuiteContext
from ..procs import ServerFailed
from ..report import Section, Target, footer, num, targets
from ..servers import Server, started, zeroserve
from ..stats import median, percentile
from ..streamclient import StreamStats, stream_load
from ._api import GROUP, GROUP_TITLE

PARALLEL = 4  # engine slots
CLIENTS = 8  # interactive streams, twice the slots: the slots are contended
LINES, QUICK_LINES = 2000, 200  # lines of the batch beside the interactive load
THROUGHPUT_LINES, QUICK_THROUGHPUT_LINES = 200, 48  # lines of the batch run alone
MAX_TOKENS = 8
LOW = 3  # the low class of the aging question (class 0 is the load's)
AGING_S = 1.0  # the server's default (runtime/classes.py DEFAULT_AGING_S)
MESSAGES = [{"role": "user", "content": "Name a colour."}]
FIFO_ENV = {"ZEROSERVE_RUNTIME__PRIORITY_AGING_S": "0"}


def _chat(stream: bool, priority: int | None = None) -> dict[str, object]:
    body: dict[str, object] = {
        "model": "smollm2",
        "messages": MESSAGES,
        "max_tokens": MAX_TOKENS,
        "temperature": 0,
        "stream": stream,
    }
    if priority is not None:
        body["priority"] = priority
    return body


def _server(work: Path, name: str, fifo: bool) -> Server:
    spec = f"smollm2?parallel={PARALLEL}&n_ctx={PARALLEL * 512}&threads=1&queue_depth=4096"
    data = work / f"priorities-{name}"
    srv = zeroserve(spec, name=name, extra=("--no-ui", "--data-dir", str(data)))
    return replace(srv, env=lambda port: dict(FIFO_ENV)) if fifo else srv


async def _submit(port: int, lines: int) -> str:
    """Upload a batch of ``lines`` chat lines and create it; its id."""
    data = b"".join(
        json.dumps(
            {
                "custom_id": f"l{i}",
                "method": "POST",
                "url": "/v1/chat/completions",
                "body": _chat(False),
            }
        ).encode()
        + b"\n"
        for i in range(lines)
    )
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=120) as c:
        up = await c.post("/v1/files", data={"purpose": "batch"},
                          files={"file": ("in.jsonl", data, "application/jsonl")})  # fmt: skip
        up.raise_for_status()
        made = await c.post(
            "/v1/batches",
            json={"input_file_id": up.json()["id"], "endpoint": "/v1/chat/completions",
                  "completion_window": "24h"},
        )  # fmt: skip
        made.raise_for_status()
        return str(made.json()["id"])


async def _batch(port: int, bid: str) -> dict[str, object]:
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=60) as c:
        r = await c.get(f"/v1/batches/{bid}")
        r.raise_for_status()
        out: dict[str, object] = r.json()
        return out


async def _batch_rate(port: int, lines: int, limit_s: float) -> float:
    """Lines per second of a batch of ``lines`` run alone (create to completed)."""
    t0 = time.perf_counter()
    bid = await _submit(port, lines)
    while time.perf_counter() - t0 < limit_s:
        b = await _batch(port, bid)
        if b["status"] in ("completed", "failed", "expired", "cancelled"):
            counts = b["request_counts"]
            assert isinstance(counts, dict)
            done = int(counts["completed"])
            return done / (time.perf_counter() - t0) if b["status"] == "completed" else math.nan
        await asyncio.sleep(0.05)  # polling the batch's status: a client's cadence
    return math.nan


async def _saturating_rate(port: int, seconds: float) -> float:
    """Requests per second of 2 x PARALLEL clients sending the batch's request back to
    back (the interactive way to the same work)."""
    done = 0
    end = time.perf_counter() + seconds
    body = _chat(False)
    limits = httpx.Limits(max_connections=2 * PARALLEL)
    async with httpx.AsyncClient(
        base_url=f"http://127.0.0.1:{port}", timeout=120, limits=limits
    ) as c:

        async def worker() -> None:
            nonlocal done
            while time.perf_counter() < end:
                r = await c.post("/v1/chat/completions", json=body)
                r.raise_for_status()
                done += 1

        t0 = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(2 * PARALLEL)))
        return done / (time.perf_counter() - t0)


async def _interactive(port: int, seconds: float, lines: int) -> tuple[StreamStats, bool]:
    """CLIENTS chat streams for ``seconds``; with a batch of ``lines`` running (0: none).
    Whether the batch was still running when the window ended."""
    bid = await _submit(port, lines) if lines else None
    if bid is not None:  # the load starts once the batch runs
        while (await _batch(port, bid))["status"] == "validating":
            await asyncio.sleep(0.05)
    body = json.dumps(_chat(True)).encode()
    stats = await stream_load(port, "/v1/chat/completions", body, CLIENTS, seconds)
    running = True
    if bid is not None:
        running = (await _batch(port, bid))["status"] == "in_progress"
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=60) as c:
            await c.post(f"/v1/batches/{bid}/cancel")
    return stats, running


async def _aging(port: int, seconds: float) -> tuple[StreamStats, StreamStats]:
    """CLIENTS class-0 streams and one class-LOW stream at a time, together."""
    high = json.dumps(_chat(True, 0)).encode()
    low = json.dumps(_chat(True, LOW)).encode()
    h, lo = await asyncio.gather(
        stream_load(port, "/v1/chat/completions", high, CLIENTS, seconds),
        stream_load(port, "/v1/chat/completions", low, 1, seconds),
    )
    return h, lo


def priorities(ctx: SuiteContext) -> Section:
    settings = ctx.settings()
    secs = float(settings.duration_s)
    lines = QUICK_LINES if ctx.quick else LINES
    alone_lines = QUICK_THROUGHPUT_LINES if ctx.quick else THROUGHPUT_LINES
    ttft: dict[str, list[float]] = {}
    running: dict[str, bool] = {}
    rates: dict[str, list[float]] = {"batch": [], "client": []}
    aging: list[tuple[StreamStats, StreamStats]] = []
    failures = 0
    error: str | None = None
    for name, fifo in (("classes", False), ("fifo", True)):
        server = _server(settings.work, f"zeroserve-{name}", fifo)
        error = error or server.missing()
        if error:
            break
        try:
            with started(server, ctx.pins, ctx.results_dir) as proc:
                asyncio.run(_interactive(proc.port, max(1.0, settings.warmup_s), 0))  # warm
                for _ in range(settings.rounds):
                    for label, n in ((f"{name}, alone", 0), (f"{name}, with batch", lines)):
                        st, still = asyncio.run(_interactive(proc.port, secs, n))
                        ttft.setdefault(label, []).extend(st.ttft_ms)
                        running[label] = running.get(label, True) and still
                        failures += st.failures
                        print(f"  priorities {label}: p99 TTFT "
                              f"{percentile(st.ttft_ms, 99) if st.ttft_ms else math.nan:.0f} ms, "
                              f"{st.streams} streams, {st.failures} failures", flush=True)  # fmt: skip
                if fifo:
                    continue
                for _ in range(settings.rounds):
                    rates["batch"].append(
                        asyncio.run(_batch_rate(proc.port, alone_lines, 20 * secs + 120))
                    )
                    rates["client"].append(asyncio.run(_saturating_rate(proc.port, secs)))
                    print(f"  priorities throughput: batch {rates['batch'][-1]:.2f} lines/s, "
                          f"client {rates['client'][-1]:.2f} req/s", flush=True)  # fmt: skip
                for _ in range(settings.rounds):
                    aging.append(asyncio.run(_aging(proc.port, 2 * secs)))
        except ServerFailed as exc:
            error = f"start failed: {exc}"
    return _section(ctx, settings, lines, ttft, running, rates, aging, failures, error)


def _p99(values: list[float]) -> float:
    return percentile(values, 99) if values else math.nan


def _section(
    ctx: SuiteContext,
    settings: Settings,
    lines: int,
    ttft: dict[str, list[float]],
    running: dict[str, bool],
    rates: dict[str, list[float]],
    aging: list[tuple[StreamStats, StreamStats]],
    failures: int,
    error: str | None,
) -> Section:
    out = [
        "### Priority classes and the Batch API on one model",
        "",
        f"`smollm2` (llama.cpp, {PARALLEL} slots, 1 thread): its slots are where requests "
        f"wait, so the class order shows there. {CLIENTS} chat streams "
        f"({MAX_TOKENS} tokens each), alone and beside a batch of {lines} chat lines on the "
        "same model; the same on a server with classes off (`priority_aging_s = 0`, FIFO). "
        "Batch throughput: a batch run alone against 2 x slots clients sending the same "
        f"request. Aging: one class-{LOW} stream at a time under {CLIENTS} class-0 streams.",
        *footer(
            ctx,
            settings,
            notes=[
                "The machine is shared (other work runs on it): ratios compare runs minutes apart.",
            ],
        ),
        "",
        "| case | first-token p50 (ms) | p99 (ms) | streams | batch still running |",
        "|---|--:|--:|--:|---|",
    ]
    if error:
        out.append(f"| not measured: {error.splitlines()[0][:140]} | | | | |")
    for label, vals in ttft.items():
        still = "yes" if running.get(label) else "no (it ended first)"
        out.append(
            f"| {label} | {num(percentile(vals, 50) if vals else math.nan)} | "
            f"{num(_p99(vals))} | {len(vals)} | {still if 'batch' in label else ''} |"
        )
    batch_rate, client_rate = median(rates["batch"]), median(rates["client"])
    out += [
        "",
        f"Batch alone: {num(batch_rate)} lines/s; a saturating client: {num(client_rate)} "
        f"requests/s (median of {len(rates['batch'])}).",
    ]
    worst_low = max((max(lo.ttft_ms) for _, lo in aging if lo.ttft_ms), default=math.nan)
    longest_high = max((max(h.ttft_ms) for h, _ in aging if h.ttft_ms), default=math.nan)
    gap = max((max(h.itl_ms) for h, _ in aging if h.itl_ms), default=math.nan)
    # The bound, from the client's side: passed over for LOW x aging_s at most; then the
    # work ahead of it is class-0 requests that arrived before, which all start within the
    # longest class-0 wait, and the slot it gets frees when one of them ends, within one
    # generation (MAX_TOKENS - 1 gaps, each at most the longest gap measured).
    generation = (MAX_TOKENS - 1) * gap
    bound_ms = LOW * AGING_S * 1000 + longest_high + generation
    lows = sum(len(lo.ttft_ms) for _, lo in aging)
    out.append(
        f"Aging: {lows} class-{LOW} streams, worst first token {num(worst_low)} ms; "
        f"bound: passed over for {LOW * AGING_S:.0f} s + the longest class-0 wait "
        f"({num(longest_high)} ms) + one class-0 generation ({MAX_TOKENS - 1} x the longest "
        f"gap, {num(generation)} ms) = {num(bound_ms)} ms. {failures} failed streams in all."
    )
    alone = _p99(ttft.get("classes, alone", []))
    beside = _p99(ttft.get("classes, with batch", []))
    fifo_beside = _p99(ttft.get("fifo, with batch", []))
    out += targets(
        [
            Target(
                "first-token p99, with a batch / alone",
                "≤1.5x",
                beside / alone if alone else math.nan,
                "{:.2f}x",
                lambda v: v <= 1.5,
                note=f"(FIFO with the batch: {fifo_beside / alone if alone else math.nan:.2f}x)",
            ),
            Target(
                "batch lines/s alone / a saturating client's requests/s",
                "≥90 %",
                100 * batch_rate / client_rate if client_rate else math.nan,
                "{:.0f} %",
                lambda v: v >= 90,
            ),
            Target(
                f"worst class-{LOW} wait under class-0 load / the stated bound",
                "≤1x",
                worst_low / bound_ms if bound_ms else math.nan,
                "{:.2f}x",
                lambda v: v <= 1.0,
            ),
        ]
    )
    return Section(GROUP, GROUP_TITLE, "\n".join(out))
