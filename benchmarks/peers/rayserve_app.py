"""Ray Serve's own HTTP path, as its users write it: a FastAPI ingress deployment behind
Serve's HTTP proxy, calling an identity model deployment through its handle, serving the
KServe V2 binary extension (``POST /v2/models/echo/infer``) of the RAY suite.

This process starts a local Ray of its own (no dashboard; the nodes register 127.0.0.1),
starts Serve with its proxy on ``--host``/``--port`` (127.0.0.1 only), runs the
application, and on SIGTERM shuts Serve and Ray down again.
"""

import argparse
import json
import logging
import os
import signal
import sys
import threading
from typing import Any

import numpy as np
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response

# A Ray of one machine registers 127.0.0.1, not the host's routable address (as
# zeroserve's own local Ray does, ``runtime/ray/cluster.py``).
os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")

from ray.serve.handle import DeploymentHandle

import ray
from ray import serve

HOST = "127.0.0.1"
# Serve's proxy and the two deployments on the two CPUs the suite gives a server.
NUM_CPUS = 2

app = FastAPI()

_DTYPES = {"FP32": np.float32, "FP64": np.float64, "INT32": np.int32, "INT64": np.int64}


@serve.deployment(ray_actor_options={"num_cpus": 0})
class Identity:
    """The model: every input back as an output of the same name."""

    def infer(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        return dict(inputs)


@serve.deployment(ray_actor_options={"num_cpus": 0})
@serve.ingress(app)
class V2Ingress:
    def __init__(self, model: DeploymentHandle[Any]) -> None:
        self.model = model

    @app.get("/health")
    async def health(self) -> Response:
        return Response(b"ok")

    @app.post("/v2/models/{name}/infer")
    async def infer(self, name: str, request: Request) -> Response:
        if name != "echo":
            return JSONResponse({"error": f"model {name!r} not found"}, status_code=404)
        body = await request.body()
        n = int(request.headers.get("inference-header-content-length", len(body)))
        head = json.loads(body[:n])
        inputs: dict[str, np.ndarray] = {}
        offset = n
        for t in head["inputs"]:
            size = t["parameters"]["binary_data_size"]
            dtype = np.dtype(_DTYPES[t["datatype"]])
            arr = np.frombuffer(body, dtype, size // dtype.itemsize, offset)
            inputs[t["name"]] = arr.reshape(t["shape"])
            offset += size
        outputs = await self.model.infer.remote(inputs)
        meta = []
        blobs = []
        for key, arr in outputs.items():
            data = np.ascontiguousarray(arr).tobytes()
            meta.append(
                {
                    "name": key,
                    "datatype": next(k for k, v in _DTYPES.items() if v == arr.dtype),
                    "shape": list(arr.shape),
                    "parameters": {"binary_data_size": len(data)},
                }
            )
            blobs.append(data)
        out_head = json.dumps({"model_name": name, "outputs": meta}).encode()
        return Response(
            out_head + b"".join(blobs),
            media_type="application/octet-stream",
            headers={"Inference-Header-Content-Length": str(len(out_head))},
        )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--host", default=HOST)
    parser.add_argument("--port", type=int, required=True)
    args = parser.parse_args(argv)
    stop = threading.Event()
    ray.init(
        num_cpus=NUM_CPUS,
        include_dashboard=False,
        logging_level=logging.WARNING,
        log_to_driver=False,
        _node_ip_address=HOST,
        # The replicas import this module by name, as the driver does.
        runtime_env={"env_vars": {"PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}},
    )
    # After ray.init, which installs a SIGTERM handler of its own that aborts the process
    # (and would leave its agents behind): a SIGTERM stops Serve and Ray cleanly.
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    try:
        serve.start(http_options={"host": args.host, "port": args.port})
        serve.run(V2Ingress.bind(Identity.bind()), route_prefix="/")  # type: ignore[attr-defined]
        stop.wait()
    finally:
        try:
            serve.shutdown()  # type: ignore[no-untyped-call]
        finally:
            ray.shutdown()  # type: ignore[no-untyped-call]
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
