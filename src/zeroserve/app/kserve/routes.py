"""KServe V2 / Open Inference Protocol REST endpoints, with Triton's binary tensor extension.

=========================================================  ==================================
``GET  /v2``                                               server metadata (extensions)
``GET  /v2/health/live``, ``/v2/health/ready``             200 when true, 400 when false
``GET  /v2/models/{m}[/versions/{v}]``                     model metadata
``GET  /v2/models/{m}[/versions/{v}]/ready``               200 when ready, 400 when not
``POST /v2/models/{m}[/versions/{v}]/infer``               inference, JSON or binary
=========================================================  ==================================

Health answers follow the protocol: the status code is the answer (200 true, 4xx false),
and the body is the JSON object of the newer spec (``{"live": true}``, ``{"ready": ...}``,
``{"name": m, "ready": ...}``).

Models have one version, ``"1"`` (a model class may set a ``version`` attribute); any
other version is a 404. Errors are ``{"error": "<message>"}`` with the error's status:
400 malformed or inconsistent request, 404 unknown model/version/route, 413 body too
large, 429/503 admission, 504 deadline.

Request ``parameters`` reach the model as the input ``"__parameters__"``: a one-element
BYTES tensor holding the parameters' JSON (``json.loads(inputs["__parameters__"][0])``),
present only when the request has parameters other than ``binary_data_output``. It is not
returned as an output. Triton's ``timeout`` parameter (microseconds) sets the
request's deadline, capped by the model's limit (``app/deadlines.py``); the outputs of
one response may carry at most ``ApiLimits.v2_output_bytes``.

The binary protocol is detected by the ``Inference-Header-Content-Length`` header alone;
``Content-Type`` is ignored (many clients send none). ``Content-Encoding: gzip`` and
``deflate`` bodies (tritonclient's request compression) are inflated once (counted copy).
"""

from __future__ import annotations

import importlib.metadata
import zlib
from typing import Any
from urllib.parse import unquote

import numpy as np

from ... import metrics
from ...errors import CapabilityError, ModelNotFound, PayloadTooLarge, RequestError
from ...runtime import Engine, ModelHandle
from ..apidoc import Refinement
from ..backends import Backends
from ..limits import MAX_TIMEOUT_S, ApiLimits, check_count
from ..request import Request
from ..response import JSON, OCTET, Response
from ..router import RouteDoc, Router
from . import codec
from .schemas import (
    InferenceRequest,
    InferenceResponse,
    MetadataTensor,
    ModelMetadata,
    ModelReady,
    RequestInput,
    ResponseOutput,
    ServerMetadata,
    encoder,
)

SERVER_NAME = "zeroserve"
EXTENSIONS = ["binary_tensor_data"]
# Largest body a compressed request may inflate to: the default cap on an uncompressed
# body (http.limits.MAX_BODY_BYTES), so compression cannot smuggle in a bigger request.
MAX_INFLATED_BYTES = 128 * 1024 * 1024

_IHCL = b"inference-header-content-length"


def _version() -> str:
    try:
        return importlib.metadata.version("zeroserve")
    except importlib.metadata.PackageNotFoundError:
        return "0"


def _json(obj: Any, status: int = 200) -> Response:
    return Response(status, [encoder.encode(obj)], content_type=JSON)


def register(
    router: Router,
    engine: Engine,
    limits: ApiLimits | None = None,
    backends: Backends | None = None,
) -> None:
    """The V2 routes; ``backends``: where an unloaded catalog model is loaded on demand
    (its ``loadable`` and ``wait_loaded``), when models come and go at run time."""
    api_limits = limits or ApiLimits()
    server_meta = _json(ServerMetadata(SERVER_NAME, _version(), EXTENSIONS))
    live_ok = _json({"live": True})
    ready_ok = _json({"ready": True})
    ready_no = _json({"ready": False}, 400)

    def handle_of(req: Request) -> ModelHandle:
        name = unquote(req.params["model"])
        handle = engine.model(name)
        version = req.params.get("version")
        if version is not None and unquote(version) not in _versions(handle):
            raise ModelNotFound(f"model {name!r} has no version {unquote(version)!r}")
        return handle

    def server_metadata(req: Request) -> Response:
        return server_meta

    def live(req: Request) -> Response:
        return live_ok

    def ready(req: Request) -> Response:
        return ready_ok if engine.ready() else ready_no

    def model_metadata(req: Request) -> Response:
        handle = handle_of(req)
        meta = handle.model
        return _json(
            ModelMetadata(
                name=handle.name,
                versions=_versions(handle),
                platform=str(meta.platform),
                inputs=[_tensor(t) for t in meta.inputs()],
                outputs=[_tensor(t) for t in meta.outputs()],
            )
        )

    def model_ready(req: Request) -> Response:
        handle = handle_of(req)
        ok = _model_ready(engine, handle)
        return _json(ModelReady(handle.name, ok), 200 if ok else 400)

    def infer_head(req: Request) -> None:
        if backends is not None and backends.loadable(unquote(req.params["model"])):
            return  # admitted by ``infer`` once the model serves
        admit(req)

    def admit(req: Request) -> None:
        handle = handle_of(req)
        if "infer" not in handle.capabilities:
            raise CapabilityError(f"model {handle.name!r} does not support V2 inference")
        length = req.head.content_length
        if length:
            engine.check_bytes(length)
        req.admit(handle)  # last: nothing after it may raise

    async def infer(req: Request) -> Response:
        if not req.has_ticket and backends is not None:
            # A catalog model loaded on demand (docs/models.md, "Models at run time"):
            # one load, waited for within the request's timeout, then the head's checks.
            await backends.wait_loaded(unquote(req.params["model"]), req)
            admit(req)
        handle = req.handle
        body = _body(req)
        json_size = codec.header_length(req.header(_IHCL), body.nbytes)
        decoded = codec.decode_request(body, json_size, api_limits)
        inputs = decoded.inputs
        params = codec.model_parameters(decoded.request)
        if params is not None:
            inputs[codec.PARAMETERS_INPUT] = params
        deadline = handle.deadline(_timeout_s(decoded.request.parameters))
        result = await handle.infer(req.take_ticket(), inputs, deadline=deadline)
        try:
            check_count(
                _output_bytes(result.outputs),
                api_limits.v2_output_bytes,
                "outputs",
                "output bytes in one response",
            )
            version = req.params.get("version")
            body_out, header_size = codec.encode_response(
                handle.name,
                unquote(version) if version is not None else _versions(handle)[0],
                decoded.request,
                result.outputs,
            )
        except BaseException:
            result.release()
            raise
        release = [lease.release for lease in result.leases]
        if header_size is None:
            return Response(200, body_out, content_type=JSON, release=release)
        headers = [(_IHCL, str(header_size).encode("ascii"))]
        return Response(200, body_out, content_type=OCTET, headers=headers, release=release)

    add = router.add
    meta = RouteDoc("Server metadata (KServe V2)", None, ServerMetadata)
    add("GET", "/v2", server_metadata, errors="kserve", doc=meta)
    add("GET", "/v2/", server_metadata, errors="kserve", doc=meta)
    add("GET", "/v2/health/live", live, errors="kserve", doc=RouteDoc("Liveness (KServe V2)"))
    add("GET", "/v2/health/ready", ready, errors="kserve", doc=RouteDoc("Readiness (KServe V2)"))
    for base in ("/v2/models/{model}", "/v2/models/{model}/versions/{version}"):
        add(
            "GET",
            base,
            model_metadata,
            errors="kserve",
            doc=RouteDoc("Model metadata (KServe V2)", None, ModelMetadata),
        )
        add(
            "GET",
            base + "/ready",
            model_ready,
            errors="kserve",
            doc=RouteDoc("Model readiness (KServe V2)", None, ModelReady),
        )
        add(
            "POST",
            base + "/infer",
            infer,
            errors="kserve",
            on_head=infer_head,
            doc=RouteDoc(
                "Inference (KServe V2, JSON or binary tensors)",
                InferenceRequest,
                InferenceResponse,
                refinements=_DATATYPES,
            ),
        )


# The datatypes the codec serves (the protocol's own list but none of its others).
_DATATYPES = tuple(
    Refinement(t, only={"datatype": {"enum": list(codec.DATATYPES)}})
    for t in (RequestInput, ResponseOutput, MetadataTensor)
)


def _versions(handle: ModelHandle) -> list[str]:
    return [str(handle.model.version)]


def _tensor(spec: Any) -> MetadataTensor:
    return MetadataTensor(spec.name, spec.datatype, list(spec.shape))


def _model_ready(engine: Engine, handle: ModelHandle) -> bool:
    if not engine.ready():
        return False
    try:
        return bool(handle.statistics().workers.ready > 0)
    except Exception:  # statistics are advisory; the engine said it is ready
        return True


def _timeout_s(params: dict[str, Any] | None) -> float | None:
    """Triton's ``timeout`` parameter (microseconds; 0 or absent: none) in seconds."""
    if not params or "timeout" not in params:
        return None
    timeout = params["timeout"]
    if (
        isinstance(timeout, bool)
        or not isinstance(timeout, int)
        or not 0 <= timeout <= MAX_TIMEOUT_S * 1e6
    ):
        raise RequestError(
            "parameter 'timeout' must be an integer number of microseconds, "
            f"at most {MAX_TIMEOUT_S * 1e6:.0f}"
        )
    return None if timeout == 0 else timeout / 1e6


def _output_bytes(outputs: Any) -> int:
    """Bytes the outputs' data takes (BYTES elements by their lengths)."""
    total = 0
    for value in outputs.values():
        if isinstance(value, np.ndarray) and value.dtype.kind == "O":
            total += sum(len(v) for v in value.reshape(-1) if isinstance(v, bytes | str))
        elif isinstance(value, np.ndarray | memoryview):
            total += value.nbytes
        elif isinstance(value, bytes | bytearray):
            total += len(value)
    return total


def _body(req: Request) -> memoryview:
    body = req.body
    encoding = req.header(b"content-encoding")
    if encoding is None:
        return body
    enc = encoding.strip().lower()
    if enc in (b"", b"identity"):
        return body
    if enc not in (b"gzip", b"deflate"):
        raise RequestError("unsupported Content-Encoding; use gzip, deflate or none", status=415)
    # wbits: 16+MAX for the gzip container, MAX for zlib (HTTP's "deflate").
    inflater = zlib.decompressobj(zlib.MAX_WBITS | (16 if enc == b"gzip" else 0))
    try:
        out = inflater.decompress(body, MAX_INFLATED_BYTES + 1)
    except zlib.error:
        raise RequestError(f"the {enc.decode()} request body is corrupt") from None
    if len(out) > MAX_INFLATED_BYTES or inflater.unconsumed_tail:
        raise PayloadTooLarge(f"the inflated request body exceeds {MAX_INFLATED_BYTES} bytes")
    if not inflater.eof:
        raise RequestError(f"the {enc.decode()} request body is truncated")
    metrics.count_copy("kserve_inflate", len(out))
    return memoryview(out)
