"""The gateway: zeroserve relaying a zeroserve ``echo`` upstream (``remote:`` model),
against the upstream measured directly and against LiteLLM's proxy."""

from __future__ import annotations

import json
import math

from ..context import SuiteContext
from ..procs import LOOPBACK
from ..report import Section, Target, eps, footer, num, rps, skipped, targets, wrk_table
from ..runner import run_grid
from ..scenarios import Case, Validator, chat_validator, sse_events
from ..servers import SUBJECT, litellm, zeroserve
from ..stats import median
from ..streamclient import count_tokens
from ._api import GROUP, GROUP_TITLE

# Gateway: ~1,000 req/s of small chat completions, as wrk connections that each
# wait a fixed delay after every answer (wrk has no open-loop rate; wrk2 is not packaged).
GW_RATE = 1000

GW_CONNECTIONS = 10

GW_MAX_CONNECTIONS = 32

GW_STREAM_TOKENS = 256

GW_STREAM_CONNECTIONS = 32

GW_QUEUE_DEPTH = 1024


def _chat_body(model: str, content: str, max_tokens: int, stream: bool = False) -> bytes:
    return json.dumps(
        {
            "model": model,
            "max_tokens": max_tokens,
            "stream": stream,
            "messages": [{"role": "user", "content": content}],
        }
    ).encode()


def _stream_validator(tokens: int) -> Validator:
    def check(status: int, headers: dict[str, str], resp: bytes) -> str | None:
        if status != 200:
            return f"status {status}: {resp[:200]!r}"
        events = sse_events(resp)
        if not events or events[-1] != b"[DONE]":
            return "stream does not end with [DONE]"
        n = sum(count_tokens(e) for e in events)
        return None if n == tokens else f"expected {tokens} content chunks, got {n}"

    return check


def gateway_cases(model: str) -> list[Case]:
    """The same three loads, addressed to ``model`` ("echo" direct, "gw" relayed)."""
    small = _chat_body(model, "Say hello to the gateway benchmark.", 16)
    prompt = " ".join(f"t{i:03d}" for i in range(GW_STREAM_TOKENS))
    stream = _chat_body(model, prompt, GW_STREAM_TOKENS, stream=True)
    h = {"Content-Type": "application/json"}
    return [
        Case(
            key="GW-rate",
            scenario="GW",
            label=f"chat ~{GW_RATE}/s",
            kind="echo",
            path="/v1/chat/completions",
            body=small,
            headers=h,
            connections=GW_CONNECTIONS,
            validate=chat_validator(16),
        ),
        Case(
            key="GW-max",
            scenario="GW",
            label=f"chat max x{GW_MAX_CONNECTIONS}",
            kind="echo",
            path="/v1/chat/completions",
            body=small,
            headers=h,
            connections=GW_MAX_CONNECTIONS,
            validate=chat_validator(16),
        ),
        Case(
            key="GW-stream",
            scenario="GW",
            label=f"{GW_STREAM_TOKENS}-token streams x{GW_STREAM_CONNECTIONS}",
            kind="stream",
            path="/v1/chat/completions",
            body=stream,
            headers={**h, "Accept": "text/event-stream"},
            connections=GW_STREAM_CONNECTIONS,
            validate=_stream_validator(GW_STREAM_TOKENS),
            events_per_request=GW_STREAM_TOKENS,
        ),
    ]


def _rate_delay_ms(case: Case) -> int:
    """Per-connection pause after each answer so that the connections together send about
    GW_RATE requests/s (less the latency itself, which is small)."""
    return round(GW_CONNECTIONS * 1000 / GW_RATE) if case.key == "GW-rate" else 0


def gateway(ctx: SuiteContext) -> Section:
    settings = ctx.settings()
    echo = f"echo=zeroserve.models.echo:EchoModel?queue_depth={GW_QUEUE_DEPTH}"
    direct = zeroserve(echo, name="direct", title="direct (zeroserve echo)")
    upstream = zeroserve(echo, name="upstream", title="upstream")
    gw = zeroserve(
        f"gw=remote:http://{LOOPBACK}:{{up}}/v1?upstream_model=echo"
        f"&queue_depth={GW_QUEUE_DEPTH}&connections=64",
        name=SUBJECT,
        title="zeroserve gateway",
        upstream=upstream,
    )
    lite = litellm(upstream)
    direct_cases = {c.key: c for c in gateway_cases("echo")}
    relay_cases = gateway_cases("gw")
    # Per round and case: direct, gateway, LiteLLM (each against a fresh upstream).
    grid = run_grid(
        [direct, gw, lite],
        relay_cases,
        settings,
        delay=_rate_delay_ms,
        case_for=lambda srv, case: direct_cases[case.key] if srv is direct else case,
    )

    def _diff(name: str, pct: float) -> float:
        """Median over rounds of (relayed - direct) latency at ``pct``, same round."""
        base = {r.round: r.latency_pct_ms.get(pct, math.nan) for r in grid.ok("GW-rate", "direct")}
        vals = [
            r.latency_pct_ms.get(pct, math.nan) - base[r.round]
            for r in grid.ok("GW-rate", name)
            if r.round in base
        ]
        vals = [v for v in vals if not math.isnan(v)]
        return median(vals) if vals else math.nan

    servers = [direct, gw, lite]
    lines = [
        "### Gateway: zeroserve relaying a zeroserve `echo` upstream",
        "",
        f"Upstream: zeroserve `echo` pinned to CPU {ctx.pins.aux_cpu}; the gateway "
        f"(`--model 'gw=remote:http://127.0.0.1:UPORT/v1?upstream_model=echo'`) or LiteLLM "
        f"pinned to CPU {ctx.pins.server_cpu}; wrk on CPU {ctx.pins.load_cpu}. `direct` is the same "
        f"wrk load sent to the upstream itself. ~{GW_RATE}/s: {GW_CONNECTIONS} wrk "
        f"connections each pausing {_rate_delay_ms(relay_cases[0])} ms after an answer "
        "(closed loop; the achieved rate is the req/s column). Added latency: relayed "
        "minus direct percentile, per round, median over rounds.",
        *footer(ctx, settings),
        "",
        *wrk_table(grid, relay_cases, servers, "direct", copies=False),
    ]
    gw_p50, gw_p99 = _diff(SUBJECT, 50.0), _diff(SUBJECT, 99.0)
    lite_p99 = _diff("litellm", 99.0)
    stream_keep = grid.ratio("GW-stream", SUBJECT, "direct", eps)
    lines += [
        "",
        f"Streams: tokens/s = completed streams/s x {GW_STREAM_TOKENS}: "
        + ", ".join(
            f"{s.title} {num(grid.med('GW-stream', s.name, eps))}"
            for s in servers
            if grid.ok("GW-stream", s.name)
        ),
    ]
    lines += [
        "",
        f"Added latency at ~{GW_RATE}/s: zeroserve gateway p50 {num(gw_p50)} ms, "
        f"p99 {num(gw_p99)} ms; LiteLLM p50 {num(_diff('litellm', 50.0))} ms, "
        f"p99 {num(lite_p99)} ms.",
    ]
    lite_tp = grid.ratio("GW-max", SUBJECT, "litellm", rps)
    goals = [
        Target("relay overhead p50", "≤0.5 ms", gw_p50, "{:.3f} ms", lambda v: v <= 0.5),
        Target("relay overhead p99", "≤2 ms", gw_p99, "{:.3f} ms", lambda v: v <= 2.0),
        Target(
            "256-token streams through the gateway",
            "≥80% of direct tokens/s",
            100 * stream_keep,
            "{:.0f}%",
            lambda v: v >= 80,
        ),
        Target("vs LiteLLM throughput", "≥3x", lite_tp, "{:.1f}x", lambda v: v >= 3),
        Target(
            "vs LiteLLM added p99",
            "≤¼ of LiteLLM's",
            gw_p99 / lite_p99 if lite_p99 and not math.isnan(lite_p99) else math.nan,
            "{:.2f} of it",
            lambda v: v <= 0.25,
        ),
    ]
    lines += targets(goals) + skipped(grid)
    if ctx.pins.aux_cpu == ctx.pins.server_cpu and ctx.pins.server_cpu is not None:
        lines += [
            "",
            "Fewer than 3 CPUs: the upstream shares the gateway's CPU, so the added "
            "latency includes the two processes competing for it.",
        ]
    return Section(GROUP, GROUP_TITLE, "\n".join(lines))
