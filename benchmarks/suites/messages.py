"""Anthropic's Messages API against chat completions on the same model: the built-in
smollm2 on llama.cpp's engine, streamed, at 8 and 32 concurrent streams. One zeroserve
serves both routes; each round measures both, in alternating order, so the ratio of a
round compares the two front ends under the same machine state. The question: does the
Messages front end (its event stream, its translation) cost anything next to chat's,
given the same backend (docs/architecture.md, "Anthropic's Messages API")?"""

from __future__ import annotations

import asyncio
import json
import math

from ..context import Settings, SuiteContext
from ..procs import ServerFailed
from ..report import Section, footer, num, round_ratios, targets
from ..servers import started, zeroserve
from ..stats import median, percentile
from ..streamclient import StreamStats, stream_load
from ._api import GROUP, GROUP_TITLE
from .llamacpp import MAX_TOKENS, N_CTX, PARALLEL, QUICK_MAX_TOKENS

CONCURRENCY = (8, 32)
APIS = ("chat", "messages")
PATHS = {"chat": "/v1/chat/completions", "messages": "/v1/messages"}
QUESTION = "What is the capital of France?"
# Level within noise: the Messages/chat ratio of tokens/s at least this, of TTFT p99 at
# most its inverse (a few percent is this machine's round-to-round spread).
LEVEL = 0.95


def _bodies(max_tokens: int) -> dict[str, bytes]:
    common = {"model": "smollm2", "stream": True, "max_tokens": max_tokens, "temperature": 0}
    return {
        "chat": json.dumps(
            {
                **common,
                "messages": [
                    {"role": "system", "content": "You are a helpful assistant."},
                    {"role": "user", "content": QUESTION},
                ],
            }
        ).encode(),
        "messages": json.dumps(
            {
                **common,
                "system": "You are a helpful assistant.",
                "messages": [{"role": "user", "content": QUESTION}],
            }
        ).encode(),
    }


def messages(ctx: SuiteContext) -> Section:
    settings = ctx.settings()
    threads = 1 if ctx.pins.pinned else 2
    max_tokens = QUICK_MAX_TOKENS if ctx.quick else MAX_TOKENS
    spec = f"smollm2?parallel={PARALLEL}&n_ctx={N_CTX}&threads={threads}&queue_depth=1024"
    server = zeroserve(spec)
    bodies = _bodies(max_tokens)
    res: dict[tuple[int, str], list[StreamStats]] = {}
    error = server.missing()
    if not error:
        try:
            with started(server, ctx.pins, ctx.results_dir) as proc:
                for rnd in range(settings.rounds):
                    for conc in CONCURRENCY:
                        order = APIS if rnd % 2 == 0 else APIS[::-1]
                        for api in order:
                            path, body = PATHS[api], bodies[api]
                            # Warm up at the measured concurrency (the engine's first batch
                            # of k sequences pays a one-time cost: llamacpp.py).
                            asyncio.run(stream_load(proc.port, path, body, conc, 0.01))
                            st = asyncio.run(
                                stream_load(proc.port, path, body, conc, settings.duration_s)
                            )
                            res.setdefault((conc, api), []).append(st)
                            print(
                                f"  messages x{conc} {api} r{rnd}: "
                                f"{st.tokens / st.duration_s:,.1f} tokens/s, ttft p99 "
                                f"{percentile(st.ttft_ms, 99):.0f} ms, {st.failures} failures "
                                f"{st.errors[:1]}",
                                flush=True,
                            )
        except ServerFailed as exc:
            error = f"start failed: {exc}"
    return _section(ctx, settings, max_tokens, threads, res, error)


def _section(
    ctx: SuiteContext,
    settings: Settings,
    max_tokens: int,
    threads: int,
    res: dict[tuple[int, str], list[StreamStats]],
    error: str | None,
) -> Section:
    def tps(conc: int, api: str) -> list[float]:
        return [s.tokens / s.duration_s for s in res.get((conc, api), [])]

    def ratios(conc: int) -> list[float]:
        return [m / c for m, c in zip(tps(conc, "messages"), tps(conc, "chat"), strict=False) if c]

    def ttft_ratios(conc: int) -> list[float]:
        pairs = zip(res.get((conc, "messages"), []), res.get((conc, "chat"), []), strict=False)
        p99s = [(percentile(m.ttft_ms, 99), percentile(c.ttft_ms, 99)) for m, c in pairs]
        return [m / c for m, c in p99s if c and not math.isnan(m)]

    lines = [
        "### Anthropic Messages against chat completions (smollm2)",
        "",
        f"`POST /v1/messages` and `POST /v1/chat/completions` on one zeroserve, `stream: "
        f"true`, greedy, `max_tokens` {max_tokens}, the same question and system prompt, "
        f"SmolLM2-135M-Instruct Q4_1 with {PARALLEL} slots, {N_CTX} KV tokens and {threads} "
        "thread(s). Each round measures both APIs at each concurrency, in alternating order. "
        "Tokens: content deltas (chat's `delta.content`, Messages' `text_delta`); TTFT: the "
        "first of them.",
        *footer(ctx, settings),
        "",
        "| streams | API | tokens/s | TTFT p50 ms | TTFT p99 ms (streams) | failures |",
        "|--:|---|--:|--:|--:|--:|",
    ]
    if error:
        lines.append(f"| | | not measured: {error.splitlines()[0][:140]} | | | |")
    for conc in CONCURRENCY:
        for api in APIS:
            runs = res.get((conc, api), [])
            if not runs:
                continue
            first = [x for s in runs for x in s.ttft_ms]
            lines.append(
                f"| {conc} | {PATHS[api]} | {num(median(tps(conc, api)))} "
                f"| {num(percentile(first, 50))} | {num(percentile(first, 99))} ({len(first)}) "
                f"| {sum(s.failures for s in runs)} |"
            )

    rows = []
    for conc in CONCURRENCY:
        rows.append(
            round_ratios(
                f"tokens/s, {conc} streams",
                f"Messages ≥{LEVEL:g}x chat",
                ratios(conc),
                lambda v: v >= LEVEL,
            )
        )
        rows.append(
            round_ratios(
                f"TTFT p99, {conc} streams",
                f"Messages ≤{1 / LEVEL:.2f}x chat",
                ttft_ratios(conc),
                lambda v: v <= 1 / LEVEL,
            )
        )
    lines += targets(rows)
    return Section(GROUP, GROUP_TITLE, "\n".join(lines))
