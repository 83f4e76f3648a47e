"""FastAPI + uvicorn with the W7/W8 bench models as a user would write them: sync ``def``
endpoints (FastAPI runs them in its threadpool). Run:
``python -m benchmarks.peers.fastapi_models --port P [--sleep-ms MS] [--spin-ms MS]``."""

from __future__ import annotations

import argparse
import threading
import time

import uvicorn
from fastapi import FastAPI
from fastapi.responses import Response

from ..models import spin

LOOPBACK = "127.0.0.1"
# The defaults of the W7 (sleep) and W8 (spin) suites.
SLEEP_MS = 10.0
SPIN_MS = 20.0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--sleep-ms", type=float, default=SLEEP_MS)
    p.add_argument("--spin-ms", type=float, default=SPIN_MS)
    args = p.parse_args(argv)
    app = FastAPI()
    lock = threading.Lock()  # one request at a time: the same capacity as workers=1

    @app.get("/health")
    async def health() -> Response:
        return Response(b'{"status":"ok"}', media_type="application/json")

    @app.post("/v1/raw/sleep")
    def sleep_model() -> Response:
        with lock:
            time.sleep(args.sleep_ms / 1000.0)
        return Response(b"ok", media_type="application/octet-stream")

    @app.post("/v1/raw/spin")
    def spin_model() -> Response:
        return Response(str(spin(args.spin_ms)).encode(), media_type="application/octet-stream")

    uvicorn.run(app, host=LOOPBACK, port=args.port, log_level="warning", access_log=False)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
