"""The built-in smollm2 on llama.cpp's engine: chat streams at 1, 8 and 32 concurrent
streams through zeroserve, against llama.cpp's own HTTP server and FastAPI wrapping the
same engine calls (``peers/llamacpp_engine.py``): same GGUF, threads and slots, so the
engine is identical and the difference is the HTTP layer. ``/health`` is probed from a
process of its own while the streams run; each round also probes the floor: zeroserve
with only the ``echo`` model, idle, on its CPU alone and on its CPU shared with one busy
loop (what the engine's thread does to the server's core)."""

from __future__ import annotations

import asyncio
import json
import math
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..context import Settings, SuiteContext
from ..procs import ServerFailed
from ..report import Section, Target, footer, num, probe_note, round_ratios, targets, times
from ..servers import BASELINE, SUBJECT, Server, importable, started, zeroserve
from ..stats import median, percentile
from ..streamclient import StreamStats, stream_load
from ._api import GROUP, GROUP_TITLE
from ._health import PROBE_SLACK_S, HealthProbe, floor_lines, measure_floor

CONCURRENCY = (1, 8, 32)
# Engine slots and KV tokens (512 a slot): 8 slots is where 2 cores stop gaining.
PARALLEL = 8
N_CTX = PARALLEL * 512
MAX_TOKENS, QUICK_MAX_TOKENS = 32, 16
MESSAGES = [
    {"role": "system", "content": "You are a helpful assistant."},
    {"role": "user", "content": "What is the capital of France?"},
]
# Every round's samples, in the results directory (``rounds_json``).
RAW_FILE = "llamacpp-rounds.json"
# /health p99 target while the model is saturated (ms).
HEALTH_TARGET_MS = 2.0
# SmolLM2-135M-Instruct Q4_1: quantized dot products a token (GFLOP) and the weights a
# decode step reads (GB); the batching paragraph turns the run's one-stream rate into both.
GFLOP_PER_TOKEN = 0.27
WEIGHTS_GB = 0.09


def _engine_peer(mode: str, name: str, title: str, threads: int) -> Server:
    def argv(port: int, up: int | None, work: Path) -> list[str]:
        return [
            sys.executable,
            "-m",
            "benchmarks.peers.llamacpp_engine",
            "--mode",
            mode,
            "--port",
            str(port),
            "--n-ctx",
            str(N_CTX),
            "--parallel",
            str(PARALLEL),
            "--threads",
            str(threads),
        ]

    requires = ("xllamacpp",) if mode == "native" else ("xllamacpp", "fastapi", "uvicorn")
    return Server(name, title, argv, missing=importable(*requires))


def llamacpp(ctx: SuiteContext) -> Section:
    settings = ctx.settings()
    threads = 1 if ctx.pins.pinned else 2
    max_tokens = QUICK_MAX_TOKENS if ctx.quick else MAX_TOKENS
    spec = f"smollm2?parallel={PARALLEL}&n_ctx={N_CTX}&threads={threads}&queue_depth=1024"
    servers = [
        zeroserve(spec),
        _engine_peer("native", "llama.cpp", "llama.cpp server", threads),
        _engine_peer("fastapi", "fastapi", "FastAPI+xllamacpp", threads),
    ]
    body = json.dumps(
        {
            "model": "smollm2",
            "stream": True,
            "max_tokens": max_tokens,
            "temperature": 0,
            "messages": MESSAGES,
        }
    ).encode()
    # (streams, server) -> runs of (stream stats, /health samples, server CPU seconds)
    res: dict[tuple[int, str], list[tuple[StreamStats, list[float], float]]] = {}
    errors: dict[str, str] = {}
    skipped = {s.name: why for s in servers if (why := s.missing())}
    floor: dict[str, list[float]] = {}
    probe = HealthProbe()
    try:
        _measure(ctx, settings, servers, body, probe, res, errors, skipped, floor)
    finally:
        probe.close()
    (ctx.results_dir / RAW_FILE).write_text(json.dumps(rounds_json(res, floor)))
    return _section(
        ctx, settings, servers, max_tokens, threads, res, errors, skipped, floor, probe.priority
    )


def rounds_json(
    res: dict[tuple[int, str], list[tuple[StreamStats, list[float], float]]],
    floor: dict[str, list[float]],
) -> dict[str, Any]:
    """Every round's samples as measured, so any figure of the section can be recomputed
    (and a round the machine slowed found): one entry per (streams, server, round), in
    the order the rounds ran, and the floor's probes per case."""
    return {
        "rounds": [
            {
                "streams": conc,
                "server": name,
                "round": i,
                "tokens": st.tokens,
                "streams_done": st.streams,
                "failures": st.failures,
                "duration_s": st.duration_s,
                "server_cpu_s": cpu_s,
                "ttft_ms": st.ttft_ms,
                "inter_token_ms": st.itl_ms,
                "health_ms": health,
            }
            for (conc, name), runs in res.items()
            for i, (st, health, cpu_s) in enumerate(runs)
        ],
        "floor_ms": floor,
    }


def _measure(
    ctx: SuiteContext,
    settings: Settings,
    servers: list[Server],
    body: bytes,
    probe: HealthProbe,
    res: dict[tuple[int, str], list[tuple[StreamStats, list[float], float]]],
    errors: dict[str, str],
    skipped: dict[str, str],
    floor: dict[str, list[float]],
) -> None:
    for rnd in range(settings.rounds):
        measure_floor(ctx, settings, probe, floor, errors)
        # Each round starts with the next server, so no server always runs first (after the
        # floor) or last.
        shift = rnd % len(servers)
        order = servers[shift:] + servers[:shift]
        for conc in CONCURRENCY:
            for srv in order:
                if srv.name in skipped or srv.name in errors:
                    continue
                try:
                    with started(srv, ctx.pins, ctx.results_dir) as server:
                        # Warm up at the measured concurrency: the engine's first batch of
                        # k sequences pays a one-time cost (seconds for 8 on one thread:
                        # 2-4 s TTFT, then 0.1-0.3 s), which a one-stream warm-up leaves
                        # inside the window.
                        asyncio.run(
                            stream_load(server.port, "/v1/chat/completions", body, conc, 0.01)
                        )
                        u0 = server.usage()
                        probing = probe.start(server.port, max(settings.duration_s - 0.5, 0.5))
                        st = asyncio.run(
                            stream_load(
                                server.port, "/v1/chat/completions", body, conc, settings.duration_s
                            )
                        )
                        cpu_s = server.usage().cpu_s - u0.cpu_s
                        window = probing.result(timeout=settings.duration_s + PROBE_SLACK_S)
                        health = window.latencies_ms
                except ServerFailed as exc:
                    errors[srv.name] = f"start failed: {exc}"
                    continue
                res.setdefault((conc, srv.name), []).append((st, health, cpu_s))
                print(
                    f"  llamacpp x{conc} {srv.name} r{rnd}: {st.tokens / st.duration_s:,.1f} "
                    f"tokens/s, ttft p50 {percentile(st.ttft_ms, 50):.0f} ms, /health p99 "
                    f"{percentile(health, 99):.2f} ms, {st.failures} failures {st.errors[:1]}",
                    flush=True,
                )


def _section(
    ctx: SuiteContext,
    settings: Settings,
    servers: list[Server],
    max_tokens: int,
    threads: int,
    res: dict[tuple[int, str], list[tuple[StreamStats, list[float], float]]],
    errors: dict[str, str],
    skipped: dict[str, str],
    floor: dict[str, list[float]],
    probe_priority: str,
) -> Section:
    def tps(conc: int, name: str) -> list[float]:
        return [s.tokens / s.duration_s for s, _, _ in res.get((conc, name), [])]

    def per_cpu(conc: int, name: str) -> list[float]:
        return [s.tokens / c for s, _, c in res.get((conc, name), []) if c > 0]

    def ratios(conc: int, name: str, peer: str) -> list[float]:
        """Per round: ``name``'s tokens/s over ``peer``'s (both measured in that round)."""
        return [a / b for a, b in zip(tps(conc, name), tps(conc, peer), strict=False) if b]

    def ttft(conc: int, name: str) -> list[float]:
        return [x for s, _, _ in res.get((conc, name), []) for x in s.ttft_ms]

    def ttft_ratios(conc: int, name: str, peer: str) -> list[float]:
        """Per round: ``name``'s TTFT p99 over ``peer``'s (both measured in that round)."""
        mine, theirs = res.get((conc, name), []), res.get((conc, peer), [])
        p99s = [
            (percentile(a.ttft_ms, 99), percentile(b.ttft_ms, 99))
            for (a, _, _), (b, _, _) in zip(mine, theirs, strict=False)
        ]
        return [a / b for a, b in p99s if b and not math.isnan(a)]

    lines = [
        "### smollm2 on llama.cpp's engine",
        "",
        f"`POST /v1/chat/completions`, `stream: true`, greedy, `max_tokens` {max_tokens}, "
        f"SmolLM2-135M-Instruct Q4_1 with {PARALLEL} slots, {N_CTX} KV tokens and "
        f"{threads} thread(s) on every server. llama.cpp server: the HTTP server "
        "`xllamacpp.Server` starts (the same engine build). FastAPI: `handle_chat_completions` "
        "in a thread, chunks through `call_soon_threadsafe` into a `StreamingResponse`. "
        "`/health` is probed every 5 ms on one keep-alive connection during the load, from a "
        "process of its own (not a thread of the load client, whose loop would hold the GIL "
        "against it). "
        f"{probe_note('probe', probe_priority)} "
        "Tokens per CPU-second: tokens received over the server process's CPU time in the "
        "window (the fair comparison where other work shares the server's CPU).",
        *footer(ctx, settings),
        "",
        "| streams | server | tokens/s | vs llama.cpp | tokens/CPU-s | TTFT p50 ms "
        "| TTFT p99 ms (streams) | inter-token p99 ms "
        f"| /health p99 ms (target ≤{HEALTH_TARGET_MS:g}) | failures |",
        "|--:|---|--:|--:|--:|--:|--:|--:|--:|--:|",
    ]
    for conc in CONCURRENCY:
        for srv in servers:
            runs = res.get((conc, srv.name), [])
            if not runs:
                why = skipped.get(srv.name) or errors.get(srv.name, "no result")
                lines.append(
                    f"| {conc} | {srv.title} | not measured: {why.splitlines()[0][:140]} "
                    "| | | | | | | |"
                )
                continue
            vs = ratios(conc, srv.name, "llama.cpp")
            first = ttft(conc, srv.name)
            itl = [x for s, _, _ in runs for x in s.itl_ms]
            health = [x for _, h, _ in runs for x in h]
            lines.append(
                f"| {conc} | {srv.title} | {num(median(tps(conc, srv.name)))} "
                f"| {times(median(vs) if vs else math.nan)} "
                f"| {num(median(per_cpu(conc, srv.name)))} "
                f"| {num(percentile(first, 50))} | {num(percentile(first, 99))} ({len(first)}) "
                f"| {num(percentile(itl, 99))} | {num(percentile(health, 99))} | {sum(s.failures for s, _, _ in runs)} |"
            )
    lines += [
        "",
        "Inter-token: the gap between two content chunks of a stream as the client read them "
        "(chunks arriving in one read are 0 ms apart). TTFT p99 in the table is pooled over "
        "the rounds' streams. The targets compare per round (both servers measured in the "
        "same round), the median of the rounds' ratios with its 95 % interval: for TTFT p99 "
        "too, because a round's streams share its throughput. At 32 streams TTFT is mostly "
        "the wait for one of the 8 slots, so a round the machine slowed moves every stream of "
        "it, and a pooled p99 is the p99 of the slowest rounds. Every round's samples: "
        f"`{RAW_FILE}` in the results directory (not committed).",
        *_targets(ratios, ttft_ratios, res),
        "",
        _batching(tps),
    ]
    lines += floor_lines(floor, errors, probe_priority)
    return Section(GROUP, GROUP_TITLE, "\n".join(lines))


def _streams(conc: int) -> str:
    return f"{conc} stream" + ("s" if conc > 1 else "")


def _targets(
    ratios: Callable[[int, str, str], list[float]],
    ttft_ratios: Callable[[int, str, str], list[float]],
    res: dict[tuple[int, str], list[tuple[StreamStats, list[float], float]]],
) -> list[str]:
    """The issue's targets, judged on this run's point estimates, each with its interval."""

    against_llamacpp: list[tuple[str, str, Callable[..., list[float]], Callable[[float], bool]]]
    against_llamacpp = [
        ("tokens/s", "≥0.97x llama.cpp's server", ratios, lambda v: v >= 0.97),
        ("TTFT p99", "≤1x llama.cpp's server's", ttft_ratios, lambda v: v <= 1.0),
    ]
    rows = [
        round_ratios(f"{what}, {_streams(conc)}", goal, per_round(conc, SUBJECT, "llama.cpp"), met)
        for what, goal, per_round, met in against_llamacpp
        for conc in CONCURRENCY
    ]
    fast, ceiling = ratios(32, SUBJECT, BASELINE), ratios(32, "llama.cpp", BASELINE)
    rows.append(
        Target(
            "tokens/s, 32 streams",
            "≥1.5x FastAPI+xllamacpp",
            median(fast) if fast else math.nan,
            "{:.2f}x",
            lambda v: v >= 1.5,
            note=(
                f"(llama.cpp's own server on the same engine: "
                f"{times(median(ceiling) if ceiling else math.nan)} FastAPI, the most any "
                "HTTP layer can gain over it here)"
            ),
        )
    )
    health = [x for _, h, _ in res.get((8, SUBJECT), []) for x in h]
    rows.append(
        Target(
            "/health p99, 8 streams",
            f"≤{HEALTH_TARGET_MS:g} ms",
            percentile(health, 99),
            "{:.2f} ms",
            lambda v: v <= HEALTH_TARGET_MS,
        )
    )
    return targets(rows)


def _batching(tps: Callable[[int, str], list[float]]) -> str:
    """What continuous batching gains in this run (8 and 32 streams against 1), and why,
    reasoned from this run's one-stream rate."""

    def gain(name: str, conc: int) -> str:
        one, many = median(tps(1, name)), median(tps(conc, name))
        return times(many / one if one else math.nan)

    one = median(tps(1, SUBJECT))
    return (
        f"Continuous batching: 8 streams give {gain(SUBJECT, 8)} the tokens/s of one stream "
        f"through zeroserve ({gain('llama.cpp', 8)} through llama.cpp's server), 32 give "
        f"{gain(SUBJECT, 32)}. Why so little here: on one core a step of one sequence "
        f"already keeps the arithmetic busy (SmolLM2-135M is about {GFLOP_PER_TOKEN:g} GFLOP "
        f"of quantized dot products a token; this run's {num(one)} tokens/s of one stream is "
        f"~{num(one * GFLOP_PER_TOKEN)} GFLOP/s), while its ~{WEIGHTS_GB * 1000:.0f} MB of "
        f"Q4_1 weights stream at ~{num(one * WEIGHTS_GB)} GB/s, well within the core's memory "
        "bandwidth. A step of 8 sequences "
        "does 8 times the arithmetic and saves only what a step pays once (the weights' "
        "reads, the step's fixed costs). On a GPU, or many cores, one sequence's step is "
        "bound by reading the weights and the arithmetic units mostly wait, so a step of 8 "
        "costs little more than a step of 1 and tokens/s grows nearly with the batch until "
        "the arithmetic is saturated (reasoned from these figures, not measured here)."
    )
