"""An optional peer: granian (Rust HTTP server) with its native RSGI interface, buffered.

The fastest Python peer for SSE. Run:
``python -m benchmarks.peers.granian_app --port P`` (one worker, one runtime thread,
uvloop). Joins the benchmark only when granian is importable.
"""

from __future__ import annotations

import argparse
import json
import time
import uuid
from typing import Any

from ._echo import echo_tokens

MODELS = ("echo",)
_SSE = [("content-type", "text/event-stream")]


async def _not_found(proto: Any, model: str) -> None:
    body = json.dumps({"error": {"message": f"model {model!r} not found"}}).encode()
    proto.response_bytes(404, [("content-type", "application/json")], body)


async def app(scope: Any, proto: Any) -> None:
    if scope.proto != "http":
        return
    path, method = scope.path, scope.method
    if path == "/health":
        proto.response_bytes(200, [("content-type", "text/plain")], b"ok")
        return
    if method == "POST" and path.startswith("/v1/raw/"):
        model = path[len("/v1/raw/") :]
        if model not in MODELS:
            await _not_found(proto, model)
            return
        body = await proto()
        if "text/event-stream" not in (scope.headers.get("accept") or ""):
            proto.response_bytes(200, [("content-type", "application/octet-stream")], body)
            return
        stream = proto.response_stream(200, _SSE)
        for token in body.split():
            await stream.send_bytes(b"data: " + token + b"\n\n")
        return
    if method == "POST" and path == "/v1/completions":
        req = json.loads(await proto())
        model = req.get("model", "")
        if model not in MODELS:
            await _not_found(proto, model)
            return
        prompt = req["prompt"] if isinstance(req["prompt"], str) else " ".join(req["prompt"])
        max_tokens = req.get("max_tokens")
        cid, created = f"cmpl-{uuid.uuid4().hex}", int(time.time())
        pieces = list(echo_tokens(prompt, max_tokens))
        finish = (
            "length" if max_tokens is not None and max_tokens <= len(prompt.split()) else "stop"
        )
        stream = proto.response_stream(200, _SSE)
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
            await stream.send_bytes(b"data: " + json.dumps(chunk).encode() + b"\n\n")
        await stream.send_bytes(b"data: [DONE]\n\n")
        return
    proto.response_bytes(404, [("content-type", "text/plain")], b"not found")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--ssl-certificate", help="serve HTTPS with this certificate")
    parser.add_argument("--ssl-keyfile", help="the certificate's private key (PKCS#8)")
    args = parser.parse_args(argv)
    from pathlib import Path

    from granian import Granian  # type: ignore[import-not-found]
    from granian.constants import Interfaces  # type: ignore[import-not-found]

    Granian(
        "benchmarks.peers.granian_app:app",
        address=args.host,
        port=args.port,
        interface=Interfaces.RSGI,
        workers=1,
        runtime_threads=1,
        log_enabled=False,
        ssl_cert=Path(args.ssl_certificate) if args.ssl_certificate else None,
        ssl_key=Path(args.ssl_keyfile) if args.ssl_keyfile else None,
    ).serve()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
