"""Reranking 64 documents: ``POST /v1/rerank`` against what a client does without it,
``POST /v1/embeddings`` of the query and the documents, then the cosine and the sort on
its side. Both on one zeroserve serving ``minilm`` (the offline default, a bi-encoder:
the two compute the same scores, docs/extensions.md), a closed loop of ``CONCURRENCY``
clients each; each round measures both, in alternating order, so a round's ratio
compares them under the same machine state. The question: what does the route save a
client (the 65 vectors' JSON, its decode and the arithmetic) per request?"""

from __future__ import annotations

import asyncio

import httpx
import numpy as np

from ..closedloop import Window, closed_loop
from ..context import Settings, SuiteContext
from ..procs import ServerFailed
from ..report import Section, footer, num, round_ratios, targets
from ..servers import started, zeroserve
from ..stats import median
from ._api import GROUP, GROUP_TITLE

DOCUMENTS = 64
CONCURRENCY = 4
WAYS = ("rerank", "embeddings")
QUERY = "Which module reads and writes JSON?"
_TOPICS = (
    "json encodes and decodes JSON documents",
    "os.path joins and splits file system paths",
    "asyncio runs coroutines on an event loop",
    "re matches regular expressions against text",
    "csv reads and writes comma separated values",
    "sqlite3 stores tables in a single file database",
    "socket opens network connections",
    "zlib compresses and decompresses byte strings",
)
# 64 passages of ~20 words, each naming one topic.
DOCS = [
    f"Passage {i}: the standard library module where {_TOPICS[i % len(_TOPICS)]}, "
    f"with examples and notes on its options, version {i // len(_TOPICS)}."
    for i in range(DOCUMENTS)
]


async def _rerank(client: httpx.AsyncClient) -> list[int]:
    r = await client.post(
        "/v1/rerank",
        json={"model": "minilm", "query": QUERY, "documents": DOCS, "return_documents": False},
    )
    r.raise_for_status()
    return [x["index"] for x in r.json()["results"]]


async def _embeddings(client: httpx.AsyncClient) -> list[int]:
    r = await client.post("/v1/embeddings", json={"model": "minilm", "input": [QUERY, *DOCS]})
    r.raise_for_status()
    vecs = np.array([d["embedding"] for d in r.json()["data"]], dtype=np.float32)
    unit = vecs / np.linalg.norm(vecs, axis=1, keepdims=True)
    scores = unit[1:] @ unit[0]
    return [int(i) for i in np.argsort(-scores)]


async def _load(port: int, way: str, conc: int, seconds: float) -> Window:
    return await closed_loop(
        port, _rerank if way == "rerank" else _embeddings, conc, seconds, timeout_s=60
    )


def rerank(ctx: SuiteContext) -> Section:
    settings = ctx.settings()
    server = zeroserve("minilm", extra=("--no-ui",))
    res: dict[str, list[Window]] = {}
    error = server.missing()
    same = True
    if not error:
        try:
            with started(server, ctx.pins, ctx.results_dir) as proc:
                # The two ways agree on the order (the same model's cosine), checked once.
                same = asyncio.run(_agree(proc.port))
                for rnd in range(settings.rounds):
                    for way in WAYS if rnd % 2 == 0 else WAYS[::-1]:
                        asyncio.run(_load(proc.port, way, CONCURRENCY, settings.warmup_s or 0.5))
                        st = asyncio.run(_load(proc.port, way, CONCURRENCY, settings.duration_s))
                        res.setdefault(way, []).append(st)
                        print(
                            f"  rerank {way} r{rnd}: {st.rate:,.1f} req/s, "
                            f"{st.failures} failures {st.errors[:1]}",
                            flush=True,
                        )
        except ServerFailed as exc:
            error = f"start failed: {exc}"
    return _section(ctx, settings, res, error, same)


async def _agree(port: int) -> bool:
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=60) as client:
        return await _rerank(client) == await _embeddings(client)


def _section(
    ctx: SuiteContext,
    settings: Settings,
    res: dict[str, list[Window]],
    error: str | None,
    same: bool,
) -> Section:
    def rates(way: str) -> list[float]:
        return [r.rate for r in res.get(way, [])]

    lines = [
        f"### Rerank of {DOCUMENTS} documents against embeddings and a client-side cosine",
        "",
        f"`minilm` on one zeroserve; {CONCURRENCY} clients in a closed loop (httpx). "
        f"`/v1/rerank` with {DOCUMENTS} documents of ~20 words (`return_documents: false`) "
        f"against `/v1/embeddings` of the query and the same documents, then numpy's cosine "
        f"and sort in the client. Both rank the same ({'checked' if same else 'NOT the same'}"
        "). Each round measures both, in alternating order.",
        *footer(ctx, settings),
        "",
        "| way | requests/s | failures |",
        "|---|--:|--:|",
    ]
    if error:
        lines.append(f"| not measured: {error.splitlines()[0][:140]} | | |")
    for way in WAYS:
        runs = res.get(way, [])
        if runs:
            lines.append(f"| {way} | {num(median(rates(way)))} | {sum(r.failures for r in runs)} |")
    ratios = [a / b for a, b in zip(rates("rerank"), rates("embeddings"), strict=False) if b]
    lines += targets(
        [
            round_ratios(
                "requests/s, rerank / embeddings + client cosine",
                "rerank ≥1x",
                ratios,
                lambda v: v >= 1.0,
            )
        ]
    )
    return Section(GROUP, GROUP_TITLE, "\n".join(lines))
