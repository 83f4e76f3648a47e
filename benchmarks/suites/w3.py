"""W3: OpenAI chat completion with a 64 KB prompt, non-streaming, against FastAPI+pydantic."""

from __future__ import annotations

import json

from ..context import SuiteContext
from ..report import Section, Target, footer, rps, skipped, targets, wrk_table
from ..runner import run_grid
from ..scenarios import Case, chat_validator
from ..servers import BASELINE, ECHO, SUBJECT, fastapi_peer, zeroserve, zeroserve_baseline
from ._api import GROUP, GROUP_TITLE

# W3: a 64 KB prompt, a short answer.
W3_PROMPT_BYTES = 64 * 1000

W3_MAX_TOKENS = 16

W3_CONNECTIONS = 32


def w3_case() -> Case:
    words, size, i = [], 0, 0
    while size < W3_PROMPT_BYTES:
        w = f"word{i % 1000:03d}"
        words.append(w)
        size += len(w) + 1
        i += 1
    body = json.dumps(
        {
            "model": "echo",
            "max_tokens": W3_MAX_TOKENS,
            "messages": [
                {"role": "system", "content": "You are a helpful assistant."},
                {"role": "user", "content": " ".join(words)[:W3_PROMPT_BYTES]},
            ],
        }
    ).encode()
    return Case(
        key="W3-chat-64KB",
        scenario="W3",
        label=f"64 KB prompt x{W3_CONNECTIONS}",
        kind="echo",
        path="/v1/chat/completions",
        body=body,
        headers={"Content-Type": "application/json"},
        connections=W3_CONNECTIONS,
        validate=chat_validator(W3_MAX_TOKENS),
    )


def w3(ctx: SuiteContext) -> Section:
    settings = ctx.settings()
    base = zeroserve_baseline(("--model", ECHO))  # with ZSBENCH_BASELINE_SRC: an A/B
    servers = [zeroserve(ECHO), *([base] if base is not None else []), fastapi_peer()]
    case = w3_case()
    grid = run_grid(servers, [case], settings)
    ratio = grid.ratio(case.key, SUBJECT, BASELINE, rps)
    lines = [
        "### W3: OpenAI chat completion, 64 KB prompt, non-streaming",
        "",
        f"`POST /v1/chat/completions`, `echo` model, `max_tokens` {W3_MAX_TOKENS}, "
        f"{len(case.body):,} byte body; wrk, {W3_CONNECTIONS} connections. FastAPI "
        "decodes and answers with pydantic models (`peers/fastapi_app.py`).",
        *footer(ctx, settings),
        "",
        *wrk_table(grid, [case], servers, BASELINE),
        *targets(
            [Target("W3 req/s", "≥3x FastAPI+pydantic", ratio, "{:.2f}x", lambda v: v >= 3.0)]
        ),
        "",
        "granian RSGI + stdlib json is not in this suite: its peer app has no chat endpoint.",
        *skipped(grid),
    ]
    return Section(GROUP, GROUP_TITLE, "\n".join(lines))
