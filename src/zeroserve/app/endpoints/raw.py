"""``POST /v1/raw/{model}``: any bytes in, bytes (or a stream of bytes) out, no decoding.

The body reaches the model as a ``uint8`` numpy view of its lease (input ``"raw"``) and
the model's ``"raw"`` output is sent from its own memory: for ``echo`` that is the very
buffer the body was received into.

Streaming (models with ``generate``): ``Accept: text/event-stream`` gives one SSE event
per piece; ``?stream=1`` or a model without ``infer`` gives a chunked
``application/octet-stream`` body of the pieces. ``?max_tokens=N`` bounds the stream.

Deadline: ``?timeout=`` or a ``Request-Timeout`` header (seconds), counted from the
complete request and capped by the model's limit (see ``app/deadlines.py``).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ...errors import CapabilityError, RequestError
from ...models.base import GenerateRequest
from ...runtime import Engine, InferResult, ModelHandle
from ...runtime.channel import POLICIES
from ..backends import RAW, Backends
from ..deadlines import raw_timeout
from ..limits import ApiLimits, check_output_tokens
from ..request import Request
from ..response import EVENT_STREAM, OCTET, HandlerResult, Response, StreamResponse
from ..router import RouteDoc, Router

_TRUE = frozenset(("1", "true", "yes"))


def register(
    router: Router, engine: Engine, backends: Backends, limits: ApiLimits | None = None
) -> None:
    api_limits = limits or ApiLimits()

    def on_head(req: Request) -> None:
        raw_timeout(req)  # a malformed timeout is a 400 at the head
        name = req.params["model"]
        if backends.loadable(name):
            return  # admitted by ``after_load`` once the model serves
        req.admit(engine.model(name))

    def raw(req: Request) -> HandlerResult:
        if not req.has_ticket:
            return after_load(req)
        return serve(req)

    async def after_load(req: Request) -> Response | StreamResponse:
        """A catalog model loaded on demand (docs/models.md, "Models at run time"): the
        request waits for its one load within its own timeout, then is admitted."""
        name = req.params["model"]
        await backends.wait_loaded(name, req, raw_timeout(req))
        req.admit(engine.model(name))
        result = serve(req)
        if isinstance(result, (Response, StreamResponse)):
            return result
        return await result

    def serve(req: Request) -> HandlerResult:
        handle = req.handle
        deadline = handle.deadline(raw_timeout(req))
        backend = backends.get(handle.name)
        if backend.forwards:  # a remote model: relay the bytes as they are
            return backend.forward(req, RAW)
        caps = handle.capabilities
        sse = req.accepts(EVENT_STREAM)
        want_stream = sse or req.query.get("stream", "").lower() in _TRUE or "infer" not in caps
        if want_stream:
            if "generate" not in caps:
                raise CapabilityError(f"model {handle.name!r} cannot stream")
            gen = GenerateRequest(raw=req.body, max_tokens=_max_tokens(req, api_limits))
            policy = req.query.get("policy", "block")
            if policy not in POLICIES:
                raise RequestError(f"policy must be one of {', '.join(POLICIES)}", param="policy")
            stream = handle.generate(req.take_ticket(), gen, deadline=deadline, policy=policy)
            return StreamResponse(stream, framing="sse" if sse else "chunked", counts_pieces=True)
        if "infer" not in caps:
            raise CapabilityError(f"model {handle.name!r} has no raw inference")
        inputs = {"raw": np.frombuffer(req.body, dtype=np.uint8)}
        # Trivial inline models answer without a task switch (see infer_nowait). The
        # ticket stays with the request until the engine takes it: a task cancelled
        # before it starts leaves it there for the server's release.
        result = handle.infer_nowait(inputs, deadline=deadline)
        if result is None:
            return _infer(req, inputs, deadline)
        req.take_ticket().release()
        return _response(handle, result)

    async def _infer(req: Request, inputs: dict[str, Any], deadline: float) -> Response:
        handle = req.handle
        return _response(handle, await handle.infer(req.take_ticket(), inputs, deadline=deadline))

    router.add(
        "POST",
        "/v1/raw/{model}",
        raw,
        on_head=on_head,
        doc=RouteDoc("Raw bytes in, raw bytes out"),
    )


def _response(handle: ModelHandle, result: InferResult) -> Response:
    out = result.outputs.get("raw")
    if out is None:
        result.release()
        raise RequestError(f"model {handle.name!r} returned no 'raw' output")
    view = memoryview(out).cast("B") if not isinstance(out, bytes) else out
    return Response(200, [view], content_type=OCTET, release=[result.release])


def _max_tokens(req: Request, limits: ApiLimits) -> int | None:
    """``?max_tokens=``: a count within the request's output-token budget (one
    generation; see app/limits.py)."""
    value = req.query.get("max_tokens")
    if value is None:
        return None
    try:
        n = int(value)
    except ValueError:
        raise RequestError("max_tokens must be an integer", param="max_tokens") from None
    if n < 0:
        raise RequestError("max_tokens must not be negative", param="max_tokens")
    check_output_tokens(1, n, limits)
    return n
