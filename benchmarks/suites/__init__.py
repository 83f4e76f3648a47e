"""The catalog: every suite of the benchmark, one module each, in the order ``make bench``
runs them. A suite is a function ``(SuiteContext) -> Section``; its Section names the
report group it is written into (:func:`benchmarks.report.merge`).

To add a suite: write ``suites/NAME.py`` with one such function, using the harness
(:mod:`benchmarks.servers` to start servers, :func:`benchmarks.runner.run_grid` or your
own bounded client to measure, :mod:`benchmarks.stats` for percentiles,
:mod:`benchmarks.report` for tables), and add it to :data:`SUITES` below.
"""

from __future__ import annotations

from collections.abc import Callable

from ..context import SuiteContext
from ..report import Section
from . import (
    cycles,
    edge,
    gateway,
    images,
    llamacpp,
    messages,
    models,
    p64,
    priorities,
    ray,
    replace,
    rerank,
    tinyllm,
    w1,
    w2,
    w3,
    w4,
    w5,
    w6,
    w7,
    w8,
)

Suite = Callable[[SuiteContext], Section]

SUITES: dict[str, Suite] = {
    "W1": w1.w1,  # raw echo, 64 KiB / 1 MiB / 8 MiB bodies (wrk), vs Python peers
    "W2": w2.w2,  # 256-token SSE and OpenAI streams, new client's first event
    "W3": w3.w3,  # OpenAI chat, 64 KB prompt, vs FastAPI+pydantic
    "W4": w4.w4,  # KServe V2, 4 MiB tensor, binary vs JSON, vs MLServer/Triton
    "tinyllm": tinyllm.tinyllm,  # the default model's streams, vs FastAPI
    "llamacpp": llamacpp.llamacpp,  # smollm2 streams, vs llama.cpp's server and FastAPI
    "messages": messages.messages,  # smollm2 streams: Anthropic Messages vs chat completions
    "images": images.images,  # a 4 MiB data: URI image: memory and copies, vs a naive decode
    "rerank": rerank.rerank,  # /v1/rerank of 64 documents vs embeddings + a client cosine
    "priorities": priorities.priorities,  # smollm2: p99 beside a batch, batch rate, aging
    "models": models.models,  # models at run time: cold start, swap under load, memory
    "gateway": gateway.gateway,  # the remote: relay, vs direct and LiteLLM
    "W5": w5.w5,  # slow reader: bounded memory
    "W6": w6.w6,  # disconnect: the model stops
    "W7": w7.w7,  # 10x overload: fast rejections
    "W8": w8.w8,  # /health under a CPU-bound model
    "P64": p64.p64,  # 64 MiB through the process executor
    "RAY": ray.ray,  # executor=ray on the same node vs process: 4 MiB V2 binary, 256-token SSE
    "EDGE": edge.edge,  # API key vs none (W1 64 KiB, W2); W1 over TLS vs uvicorn and granian
    "replace": replace.replace,  # 8 clients while the model is replaced 5 times: 0 failures
    "cycles": cycles.cycles,  # 200 load/unload cycles per executor kind leave nothing behind
}
