"""An optional peer: aiohttp's own server (one of the faster Python stacks), buffered.

Run: ``python -m benchmarks.peers.aiohttp_app --port P``. Joins the benchmark only
when aiohttp is importable.
"""

from __future__ import annotations

import argparse
import json
import time
import uuid

from aiohttp import web  # type: ignore[import-not-found]

from ._echo import echo_tokens

MODELS = ("echo",)


async def health(request: web.Request) -> web.Response:
    return web.Response(body=b"ok", content_type="text/plain")


def _not_found(model: str) -> web.Response:
    return web.json_response({"error": {"message": f"model {model!r} not found"}}, status=404)


async def raw(request: web.Request) -> web.StreamResponse:
    model = request.match_info["model"]
    if model not in MODELS:
        return _not_found(model)
    body = await request.read()
    if "text/event-stream" not in request.headers.get("Accept", ""):
        return web.Response(body=body, content_type="application/octet-stream")
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await resp.prepare(request)
    for token in body.split():
        await resp.write(b"data: " + token + b"\n\n")
    await resp.write_eof()
    return resp


async def completions(request: web.Request) -> web.StreamResponse:
    req = await request.json()
    model = req.get("model", "")
    if model not in MODELS:
        return _not_found(model)
    prompt = req["prompt"] if isinstance(req["prompt"], str) else " ".join(req["prompt"])
    max_tokens = req.get("max_tokens")
    cid = f"cmpl-{uuid.uuid4().hex}"
    created = int(time.time())
    pieces = list(echo_tokens(prompt, max_tokens))
    finish = "length" if max_tokens is not None and max_tokens <= len(prompt.split()) else "stop"
    if not req.get("stream"):
        text = "".join(pieces)
        return web.json_response(
            {
                "id": cid,
                "object": "text_completion",
                "created": created,
                "model": model,
                "choices": [{"index": 0, "text": text, "logprobs": None, "finish_reason": finish}],
            }
        )
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await resp.prepare(request)
    for i, piece in enumerate(pieces):
        chunk = {
            "id": cid,
            "object": "text_completion",
            "created": created,
            "model": model,
            "choices": [
                {
                    "index": 0,
                    "text": piece,
                    "logprobs": None,
                    "finish_reason": finish if i == len(pieces) - 1 else None,
                }
            ],
        }
        await resp.write(b"data: " + json.dumps(chunk).encode() + b"\n\n")
    await resp.write(b"data: [DONE]\n\n")
    await resp.write_eof()
    return resp


def make_app() -> web.Application:
    app = web.Application(client_max_size=64 * 1024 * 1024)
    app.router.add_get("/health", health)
    app.router.add_post("/v1/raw/{model}", raw)
    app.router.add_post("/v1/completions", completions)
    return app


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    args = parser.parse_args(argv)
    try:
        import uvloop

        uvloop.install()
    except ImportError:
        pass
    web.run_app(make_app(), host=args.host, port=args.port, access_log=None, print=None)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
