"""``GET /v1/stats``: the values of ``/metrics`` as one small JSON document, for the
dashboard at ``/`` (docs/architecture.md, "Live statistics").

It is built on request from ``metrics.snapshot()`` (the counters and histograms of the
registry's own ``collect()``, which the Prometheus exposition renders, and the
registered ``statistics()`` snapshots) plus each model's capabilities, so nothing runs
while nobody asks. Counters are cumulative and histograms
are bucket counts: the reader takes differences between two reads for rates and
windowed percentiles, so the server keeps no per-viewer state.
"""

from __future__ import annotations

import os
import time

import msgspec

from ... import metrics
from ...runtime import Engine
from ..request import Request
from ..response import JSON, Response
from ..router import RouteDoc, Router

_encoder = msgspec.json.Encoder()
_NO_STORE = (b"cache-control", b"no-store")


def register(router: Router, engine: Engine) -> None:
    def stats(req: Request) -> Response:
        doc = metrics.snapshot()
        doc["now"] = time.monotonic()
        # The numbers are this process's: with --workers N a reader that lands on
        # another process (or a restarted server) must start its differences afresh.
        doc["process"] = os.getpid()
        doc["ready"] = engine.ready()
        doc["models"] = {name: sorted(engine.model(name).capabilities) for name in engine.names()}
        return Response(200, [_encoder.encode(doc)], content_type=JSON, headers=[_NO_STORE])

    router.add(
        "GET", "/v1/stats", stats, doc=RouteDoc("Live statistics: the /metrics values as JSON")
    )
