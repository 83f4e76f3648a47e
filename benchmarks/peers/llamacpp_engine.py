"""The llamacpp suite's peers: the same llama.cpp engine (``xllamacpp``) as zeroserve's
``smollm2``, on the same GGUF, threads and slots, served two other ways.

* ``--mode native``: llama.cpp's own HTTP server (the one ``xllamacpp.Server`` always
  starts), on ``--port``, without a key: the engine and its HTTP layer as llama.cpp ships
  them. This process only keeps it running.
* ``--mode fastapi``: FastAPI + uvicorn wrapping ``Server.handle_chat_completions`` as a
  user writes it: the call runs in a worker thread, its callback hands each chunk to the
  loop, and a ``StreamingResponse`` frames them as SSE.

Run: ``python -m benchmarks.peers.llamacpp_engine --mode native --port P``.
"""

import argparse
import asyncio
import json
import signal
import threading
from collections.abc import AsyncIterator
from typing import Any

from zeroserve.models.llamacpp import smollm2_path


def _params(args: argparse.Namespace, port: int) -> Any:
    import xllamacpp

    p = xllamacpp.CommonParams()
    p.model.path = smollm2_path()
    p.n_ctx = args.n_ctx
    p.n_parallel = args.parallel
    p.cpuparams.n_threads = args.threads
    p.cpuparams_batch.n_threads = args.threads
    p.hostnames = ["127.0.0.1"]
    p.port = port
    p.warmup = False
    p.verbosity = -1
    p.model_alias = {"smollm2"}
    return p


def native(args: argparse.Namespace) -> None:
    import xllamacpp

    server = xllamacpp.Server(_params(args, args.port))
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    print(f"llama.cpp server on {server.listening_address}", flush=True)
    stop.wait()
    del server


def fastapi(args: argparse.Namespace) -> None:
    import uvicorn
    import xllamacpp
    from fastapi import FastAPI, Request
    from fastapi.responses import Response, StreamingResponse

    server = xllamacpp.Server(_params(args, 0))
    app = FastAPI()

    @app.get("/health")
    async def health() -> Response:
        return Response(b"ok", media_type="text/plain")

    @app.post("/v1/chat/completions")
    async def chat(request: Request) -> Response:
        body = await request.body()
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[bytes | None] = asyncio.Queue()

        def on_chunk(chunk: bytes) -> bool:
            loop.call_soon_threadsafe(queue.put_nowait, chunk)
            return False  # never stops the slot: a disconnect goes unnoticed

        def run() -> None:
            try:
                server.handle_chat_completions(body, on_chunk)
            finally:
                loop.call_soon_threadsafe(queue.put_nowait, None)

        loop.run_in_executor(None, run)
        if not json.loads(body).get("stream"):
            chunk = await queue.get()
            return Response(chunk or b"", media_type="application/json")

        async def events() -> AsyncIterator[bytes]:
            while (chunk := await queue.get()) is not None:
                yield b"data: " + chunk + b"\n\n"
            yield b"data: [DONE]\n\n"

        return StreamingResponse(events(), media_type="text/event-stream")

    uvicorn.run(app, host="127.0.0.1", port=args.port, log_level="warning")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--mode", choices=["native", "fastapi"], required=True)
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--n-ctx", type=int, required=True)
    p.add_argument("--parallel", type=int, required=True)
    p.add_argument("--threads", type=int, required=True)
    args = p.parse_args()
    (native if args.mode == "native" else fastapi)(args)


if __name__ == "__main__":
    main()
