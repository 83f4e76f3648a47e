"""Models at run time (docs/models.md, "Models at run time"): what a load costs a client.

* **Cold start**: from a request for an unloaded ``smollm2`` (a ``--models-dir`` GGUF) to
  its first token, against the engine's own time for the same GGUF in the same run
  (``xllamacpp.Server`` built in a fresh process, then one token: no zeroserve at all),
  and against starting a new ``zeroserve serve --model`` process and asking it.
* **Swap under load**: 8 streams on one model while a second model is loaded and
  unloaded ten times, against the same streams without the swaps: the streams'
  inter-token p99, ``/health``'s p99 (one probe every ``PROBE_EVERY_S``), and failures.
* **Memory**: what each loaded model counts (``zeroserve_model_memory_bytes``, measured
  at its load) and how much of the server's RSS one unload gives back.
"""

from __future__ import annotations

import asyncio
import json
import math
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from ..context import Settings, SuiteContext
from ..procs import ServerFailed, ServerProcess
from ..report import Section, Target, footer, num, targets
from ..servers import Server, importable, models_dir_argv, started, zeroserve_cmd
from ..stats import median, percentile
from ._api import GROUP, GROUP_TITLE

STREAMS = 8
SWAPS = 10
MAX_TOKENS = 48
PROBE_EVERY_S = 0.05
CHAT = [{"role": "user", "content": "Count from one to twenty in words."}]
# The engine alone: build the server on the GGUF, then one token (prints JSON seconds).
_ENGINE_ONLY = """
import json, sys, time
t0 = time.monotonic()
import xllamacpp
p = xllamacpp.CommonParams()
p.model.path = sys.argv[1]; p.n_ctx = 4096; p.n_parallel = 4; p.warmup = False
p.verbosity = -1; p.port = 0; p.hostnames = ["127.0.0.1"]
s = xllamacpp.Server(p)
t1 = time.monotonic()
first = []
def on_chunk(chunk):
    if not first:
        first.append(time.monotonic())
    return True
body = {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2, "stream": True}
s.handle_chat_completions(json.dumps(body).encode(), on_chunk)
print(json.dumps({"load_s": t1 - t0, "first_token_s": first[0] - t0}))
"""


@dataclass
class Streams:
    gaps_s: list[float] = field(default_factory=list)
    health_s: list[float] = field(default_factory=list)
    failures: int = 0
    errors: list[str] = field(default_factory=list)


def _gguf() -> str:
    from zeroserve.models.llamacpp import smollm2_path

    return smollm2_path()


def _server(models_dir: Path) -> Server:
    return Server(
        "zeroserve", "zeroserve", models_dir_argv(models_dir), missing=importable("xllamacpp")
    )


async def _first_token(client: httpx.AsyncClient, model: str) -> float:
    body = {"model": model, "messages": CHAT, "max_tokens": 4, "stream": True}
    start = time.monotonic()
    async with client.stream("POST", "/v1/chat/completions", json=body) as r:
        r.raise_for_status()
        async for line in r.aiter_lines():
            if line.startswith("data: {") and '"content"' in line:
                return time.monotonic() - start
    raise RuntimeError("the stream ended without a token")


async def _cold_starts(port: int, rounds: int) -> list[float]:
    out: list[float] = []
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=120) as client:
        for _ in range(rounds):
            (await client.post("/models/unload", json={"model": "small"})).raise_for_status()
            out.append(await _first_token(client, "small"))
    return out


def _engine_only(rounds: int) -> list[dict[str, float]]:
    out = []
    for _ in range(rounds):
        done = subprocess.run(
            [sys.executable, "-c", _ENGINE_ONLY, _gguf()],
            capture_output=True,
            text=True,
            timeout=300,
            check=True,
        )
        out.append(json.loads(done.stdout.strip().splitlines()[-1]))
    return out


def _new_process(ctx: SuiteContext, rounds: int) -> list[float]:
    """From ``zeroserve serve --model small=llamacpp:GGUF`` to its first token."""
    out: list[float] = []
    spec = f"small=llamacpp:{_gguf()}"
    srv = Server(
        "zeroserve-new",
        "zeroserve (new process)",
        lambda port, up, work: [
            *zeroserve_cmd(),
            "serve",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--model",
            spec,
            "--no-ui",
        ],
    )
    for _ in range(rounds):
        start = time.monotonic()
        with started(srv, ctx.pins, ctx.results_dir) as proc:
            out.append(asyncio.run(_ask(proc.port, start)))
    return out


async def _ask(port: int, since: float) -> float:
    """Seconds from ``since`` to the first token of a stream from ``small``."""
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=120) as client:
        await _first_token(client, "small")
    return time.monotonic() - since


async def _streams(port: int, seconds: float, swaps: int) -> Streams:
    """``STREAMS`` clients streaming from ``small`` for ``seconds`` (or until ``swaps``
    load/unload cycles of ``other`` are done), ``/health`` probed all along."""
    res = Streams()
    limits = httpx.Limits(max_connections=STREAMS + 2)
    async with httpx.AsyncClient(
        base_url=f"http://127.0.0.1:{port}", timeout=120, limits=limits
    ) as client:
        stop = asyncio.Event()

        async def stream() -> None:
            body = {"model": "small", "messages": CHAT, "max_tokens": MAX_TOKENS, "stream": True}
            while not stop.is_set():
                try:
                    async with client.stream("POST", "/v1/chat/completions", json=body) as r:
                        r.raise_for_status()
                        last = None
                        async for line in r.aiter_lines():
                            if not line.startswith("data: {"):
                                continue
                            now = time.monotonic()
                            if last is not None:
                                res.gaps_s.append(now - last)
                            last = now
                except httpx.HTTPError as exc:
                    res.failures += 1
                    if len(res.errors) < 3:
                        res.errors.append(f"{type(exc).__name__}: {exc}"[:160])

        async def probe() -> None:
            while not stop.is_set():
                start = time.monotonic()
                try:
                    (await client.get("/health")).raise_for_status()
                    res.health_s.append(time.monotonic() - start)
                except httpx.HTTPError:
                    res.failures += 1
                await asyncio.sleep(PROBE_EVERY_S)

        async def swap() -> None:
            start = time.monotonic()
            for _ in range(swaps):
                for op in ("load", "unload"):
                    r = await client.post(f"/models/{op}", json={"model": "other"})
                    if r.status_code != 200:
                        res.failures += 1
            rest = seconds - (time.monotonic() - start)
            if rest > 0:
                await asyncio.sleep(rest)
            stop.set()

        tasks = [asyncio.ensure_future(stream()) for _ in range(STREAMS)]
        tasks.append(asyncio.ensure_future(probe()))
        await swap()
        await asyncio.gather(*tasks)
    return res


def _metric(port: int, line_start: str) -> float:
    for line in httpx.get(f"http://127.0.0.1:{port}/metrics").text.splitlines():
        if line.startswith(line_start + " "):
            return float(line.rsplit(" ", 1)[1])
    return math.nan


def models(ctx: SuiteContext) -> Section:
    settings = ctx.settings(full=(3, 20, 2), quick=(1, 5, 0))
    work = settings.work / "models-dir"
    work.mkdir(parents=True, exist_ok=True)
    link = work / "small.gguf"
    if not link.exists():
        link.symlink_to(_gguf())
    # ``other`` runs its engine in a child process (``engine=process``), so its loads
    # do not hold this process's GIL (docs/decisions/0050-llamacpp-engine-in-a-child-process.md).
    (work / "other.gguf").unlink(missing_ok=True)
    (work / "other").mkdir(exist_ok=True)
    (work / "other" / "model.toml").write_text(
        f'spec = "llamacpp:{_gguf()}"\n[options]\nengine = "process"\n'
    )
    server = _server(work)
    error = server.missing()
    out: dict[str, object] = {}
    if not error:
        try:
            out["engine"] = _engine_only(settings.rounds)
            with started(server, ctx.pins, ctx.results_dir) as proc:
                out["cold"] = asyncio.run(_cold_starts(proc.port, settings.rounds))
                out["memory"] = _memory(proc)
                calm, swapped = [], []
                for _ in range(settings.rounds):
                    calm.append(asyncio.run(_streams(proc.port, settings.duration_s, 0)))
                    swapped.append(asyncio.run(_streams(proc.port, settings.duration_s, SWAPS)))
                out["calm"], out["swapped"] = calm, swapped
            out["new"] = _new_process(ctx, settings.rounds)
        except (ServerFailed, subprocess.SubprocessError, RuntimeError, httpx.HTTPError) as exc:
            error = f"{type(exc).__name__}: {exc}"
    return _section(ctx, settings, out, error)


def _memory(proc: ServerProcess) -> dict[str, float]:
    port = proc.port
    with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=120) as client:
        client.post("/models/load", json={"model": "other"}).raise_for_status()
        before = proc.usage().rss_kib * 1024
        counted = {
            n: _metric(port, f'zeroserve_model_memory_bytes{{name="{n}"}}')
            for n in ("small", "other")
        }
        client.post("/models/unload", json={"model": "other"}).raise_for_status()
        after = proc.usage().rss_kib * 1024
    return {**counted, "given_back": before - after}


def _section(
    ctx: SuiteContext, settings: Settings, out: dict[str, object], error: str | None
) -> Section:
    mib = 1 << 20
    lines = [
        "### Models at run time: cold start, swap under load, memory",
        "",
        "A `--models-dir` holding SmolLM2's GGUF twice: `small`, and `other`, whose "
        "engine runs in a child process (`engine=process`). Cold start: "
        "`POST /models/unload` of `small`, then a chat stream's first token. The engine "
        "alone: `xllamacpp.Server` on the same GGUF in a fresh Python process, then one "
        "token. A new process: `zeroserve serve --model small=llamacpp:GGUF` started, "
        f"then its first token. Swap: {STREAMS} streams of {MAX_TOKENS} tokens on `small` "
        f"with and without {SWAPS} loads and unloads of `other`; `/health` probed every "
        f"{PROBE_EVERY_S * 1000:.0f} ms.",
        *footer(ctx, settings, notes=["A shared machine: read the ratios, not the times."]),
        "",
    ]
    if error:
        lines.append(f"Not measured: {error.splitlines()[0][:200]}")
        return Section(GROUP, GROUP_TITLE, "\n".join(lines))
    engine = out["engine"]
    assert isinstance(engine, list)
    cold = median(out["cold"])  # type: ignore[arg-type]
    eng_first = median(e["first_token_s"] for e in engine)
    eng_load = median(e["load_s"] for e in engine)
    new = median(out["new"])  # type: ignore[arg-type]
    calm: list[Streams] = out["calm"]  # type: ignore[assignment]
    swapped: list[Streams] = out["swapped"]  # type: ignore[assignment]
    gap_ratio = [
        percentile(s.gaps_s, 99) / percentile(c.gaps_s, 99)
        for c, s in zip(calm, swapped, strict=True)
        if c.gaps_s and s.gaps_s
    ]
    health_ratio = [
        percentile(s.health_s, 99) / percentile(c.health_s, 99)
        for c, s in zip(calm, swapped, strict=True)
        if c.health_s and s.health_s
    ]
    failures = sum(r.failures for r in (*calm, *swapped))
    memory: dict[str, float] = out["memory"]  # type: ignore[assignment]
    lines += [
        "| what | seconds |",
        "|---|--:|",
        f"| cold start in zeroserve (unloaded model to first token) | {num(cold)} |",
        f"| the engine alone: load | {num(eng_load)} |",
        f"| the engine alone: load and first token | {num(eng_first)} |",
        f"| a new zeroserve process to first token | {num(new)} |",
        "",
        "| swap under load | without swaps | with swaps |",
        "|---|--:|--:|",
        "| inter-token p99 (ms) | "
        + " | ".join(
            num(median(percentile(r.gaps_s, 99) * 1000 for r in runs if r.gaps_s))
            for runs in (calm, swapped)
        )
        + " |",
        "| /health p99 (ms) | "
        + " | ".join(
            num(median(percentile(r.health_s, 99) * 1000 for r in runs if r.health_s))
            for runs in (calm, swapped)
        )
        + " |",
        f"| failures | {sum(r.failures for r in calm)} | {sum(r.failures for r in swapped)} |",
        "",
        f"Memory: `small` counts {num(memory['small'] / mib)} MiB, `other` "
        f"{num(memory['other'] / mib)} MiB (measured at their loads); one unload of `other` "
        f"gave back {num(memory['given_back'] / mib)} MiB of the server's RSS.",
        *[f"- stream errors: {e}" for r in swapped for e in r.errors[:1]],
    ]
    lines += targets(
        [
            Target(
                "cold start / the engine's own load and first token",
                "≤1.1x",
                cold / eng_first if eng_first else math.nan,
                "{:.2f}x",
                lambda v: v <= 1.1,
            ),
            Target(
                "cold start / a new zeroserve process",
                "<1x",
                cold / new if new else math.nan,
                "{:.2f}x",
                lambda v: v < 1.0,
            ),
            Target(
                "inter-token p99, with swaps / without",
                "≤1.5x",
                median(gap_ratio) if gap_ratio else math.nan,
                "{:.2f}x",
                lambda v: v <= 1.5,
            ),
            Target(
                "/health p99, with swaps / without",
                "≤2x",
                median(health_ratio) if health_ratio else math.nan,
                "{:.2f}x",
                lambda v: v <= 2.0,
            ),
            Target("failed requests", "0", float(failures), "{:.0f}", lambda v: v == 0),
        ]
    )
    return Section(GROUP, GROUP_TITLE, "\n".join(lines))
