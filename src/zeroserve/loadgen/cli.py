"""The ``zeroserve bench`` arguments and entry point (see the package docstring)."""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
import urllib.parse
from pathlib import Path

from .client import Connection, Target
from .endpoints import ENDPOINTS, plan
from .run import MAX_CONCURRENCY, MAX_DURATION_S, MAX_REQUESTS, run
from .summary import PlotUnavailable, plot, pyplot, summarize, table, to_json

DEFAULT_REQUESTS = 100
DEFAULT_CONCURRENCY = 1
DEFAULT_MAX_TOKENS = 64
# A request with no answer after this long counts as a timeout.
DEFAULT_TIMEOUT_S = 60.0
# Model discovery (GET /v1/models) before the run.
DISCOVERY_TIMEOUT_S = 10.0
DEFAULT_PROMPT = (
    "Write a short story about a server that answers every request with "
    "exactly the bytes it was sent, and the engineers who measured it."
)

DESCRIPTION = """\
A load generator for a running server: zeroserve's or any OpenAI-compatible, KServe V2
or raw endpoint. It opens -c connections, sends -n requests (or for --duration seconds),
shows a progress bar on stderr, and prints req/s, output tokens/s, latency, time to first
token (TTFT) and inter-token latency (mean, p50, p90, p99, max) and the errors by status.

Tokens are counted as the answer arrives: with --stream, one per SSE chunk carrying
content (OpenAI) or per event (raw); without, the OpenAI answer's
usage.completion_tokens. Exit status: 0 when every request succeeded, 1 when any failed,
2 for bad arguments or when the models cannot be listed. The comparative benchmark against
other servers is `make bench` in the source tree, not this command.
"""

EXAMPLES = """\
examples:
  zeroserve bench http://127.0.0.1:8000 --stream -c 8 -n 200
  zeroserve bench http://127.0.0.1:8000 --model smollm2 --stream -c 4 -n 20 --max-tokens 32
  zeroserve bench http://127.0.0.1:8000 --endpoint v2 --model echo --duration 10
  zeroserve bench http://localhost:8001/v1 --model my-model --json
"""


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.description = DESCRIPTION
    p.epilog = EXAMPLES
    p.formatter_class = argparse.RawDescriptionHelpFormatter
    p.add_argument(
        "url",
        help="the server, e.g. http://127.0.0.1:8000 (a path such as /v1 "
        "or /api/v1 is kept as the prefix)",
    )
    p.add_argument(
        "--endpoint",
        choices=ENDPOINTS,
        default="openai-chat",
        help="the API to load (default %(default)s)",
    )
    p.add_argument("--model", help="model name (default: the first of GET /v1/models)")
    p.add_argument(
        "-c",
        "--concurrency",
        type=int,
        default=DEFAULT_CONCURRENCY,
        help="connections, each with one request at a time (default %(default)s)",
    )
    count = p.add_mutually_exclusive_group()
    count.add_argument(
        "-n",
        "--requests",
        type=int,
        default=None,
        help=f"requests to send (default {DEFAULT_REQUESTS})",
    )
    count.add_argument(
        "--duration",
        type=float,
        default=None,
        help="seconds to send requests for, instead of a count",
    )
    p.add_argument(
        "--stream",
        action="store_true",
        help="stream the answer (SSE) and measure TTFT and inter-token latency",
    )
    p.add_argument(
        "--max-tokens",
        type=int,
        default=DEFAULT_MAX_TOKENS,
        help="max_tokens of each request (default %(default)s)",
    )
    p.add_argument(
        "--ignore-eos",
        action="store_true",
        help="send vLLM's ignore_eos: every answer is --max-tokens long (OpenAI endpoints; "
        "the model must honour it)",
    )
    p.add_argument("--prompt", default=DEFAULT_PROMPT, help="the prompt (or raw body) text")
    p.add_argument(
        "--timeout",
        type=float,
        default=DEFAULT_TIMEOUT_S,
        help="seconds one request may take (default %(default)s)",
    )
    p.add_argument("--api-key", help="sent as 'Authorization: Bearer KEY'")
    p.add_argument(
        "--plot",
        type=Path,
        metavar="FILE.png",
        help="also draw latency and CDFs into a PNG (needs matplotlib: the 'bench' extra)",
    )
    p.add_argument("--json", action="store_true", help="print the report as JSON on stdout")


def _fail(message: str) -> int:
    print(f"zeroserve bench: error: {message}", file=sys.stderr)
    return 2


async def _discover(target: Target, base: str, headers: dict[str, str]) -> str:
    """The first model of GET /v1/models."""
    path = base.rstrip("/").removesuffix("/v1") + "/v1/models"
    extra = "".join(f"{k}: {v}\r\n" for k, v in headers.items())
    raw = (
        f"GET {path} HTTP/1.1\r\nHost: {target.host}\r\nAccept: application/json\r\n"
        f"{extra}Connection: close\r\n\r\n"
    ).encode("latin-1")
    body = bytearray()
    conn = Connection(target)
    try:
        async with asyncio.timeout(DISCOVERY_TIMEOUT_S):
            resp = await conn.request(raw, lambda data, now: body.extend(data))
    finally:
        await conn.close()
    if resp.status != 200:
        raise ValueError(f"GET {path} answered {resp.status}; give --model")
    models = json.loads(body).get("data") or []
    if not models:
        raise ValueError(f"GET {path} lists no model; give --model")
    return str(models[0]["id"])


def main(args: argparse.Namespace) -> int:
    """Run ``zeroserve bench`` with parsed ``args``; the exit status (1 when any request
    failed, 2 for bad arguments or an unreachable server)."""
    url = urllib.parse.urlsplit(args.url)
    if url.scheme not in ("http", "https") or not url.hostname:
        return _fail(f"URL must be http://HOST[:PORT][/PATH], got {args.url!r}")
    if not 1 <= args.concurrency <= MAX_CONCURRENCY:
        return _fail(f"-c must be 1..{MAX_CONCURRENCY}")
    requests = args.requests
    if args.duration is None and requests is None:
        requests = DEFAULT_REQUESTS
    if requests is not None and not 1 <= requests <= MAX_REQUESTS:
        return _fail(f"-n must be 1..{MAX_REQUESTS}")
    if args.duration is not None and not 0 < args.duration <= MAX_DURATION_S:
        return _fail(f"--duration must be in (0, {MAX_DURATION_S:g}] seconds")
    if args.max_tokens < 1 or args.timeout <= 0:
        return _fail("--max-tokens must be >= 1 and --timeout > 0")
    if args.plot is not None:
        try:
            pyplot()
        except PlotUnavailable as exc:
            return _fail(str(exc))
    try:
        port = url.port or (443 if url.scheme == "https" else 80)
    except ValueError:
        return _fail(f"bad port in {args.url!r}")
    target = Target(url.hostname, port, url.scheme == "https")
    headers = {"User-Agent": "zeroserve-bench"}
    if args.api_key:
        headers["Authorization"] = f"Bearer {args.api_key}"
    model = args.model
    if model is None:
        try:
            model = asyncio.run(_discover(target, url.path, headers))
        except (OSError, TimeoutError, ValueError, KeyError, TypeError) as exc:
            return _fail(f"cannot list the models of {args.url}: {exc}")
    try:
        the_plan = plan(
            args.endpoint,
            url.path,
            model,
            args.prompt,
            args.max_tokens,
            args.stream,
            args.ignore_eos,
        )
    except ValueError as exc:
        return _fail(str(exc))
    title = (
        f"zeroserve bench {args.url} {args.endpoint} model={model} "
        f"{'stream' if args.stream else 'no-stream'} c={args.concurrency}"
    )
    started = time.time()
    result = asyncio.run(
        run(target, the_plan, headers, args.concurrency, requests, args.duration, args.timeout)
    )
    s = summarize(result)
    if args.json:
        meta = {
            "url": args.url,
            "endpoint": args.endpoint,
            "model": model,
            "stream": args.stream,
            "concurrency": args.concurrency,
            "max_tokens": args.max_tokens,
            "ignore_eos": args.ignore_eos,
            "started_unix": round(started, 3),
        }
        print(json.dumps(to_json(s, meta), indent=2))
    else:
        print(table(s, title))
    if args.plot is not None:
        plot(result, args.plot, title)
        print(f"zeroserve bench: wrote {args.plot}", file=sys.stderr)
    return 0 if s.ok == s.requests else 1
