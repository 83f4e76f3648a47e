"""``GET /openapi.json``: an OpenAPI 3.1 description of every route, generated from the
msgspec schemas the endpoints decode and encode (``msgspec.json.schema_components``).

The document is built once, when the route is registered (after every other API), from
the router's own route table, so a route cannot be missing from it: routes this module
has no schema for are still listed, with their method, path parameters and error body.
msgspec writes JSON Schema 2020-12, which is OpenAPI 3.1's schema dialect.
"""

from __future__ import annotations

from importlib import metadata
from typing import Any

import msgspec

from ..kserve import schemas as ks
from ..openai import responses as rs
from ..openai import schemas as s
from ..request import Request
from ..response import JSON, Response
from ..router import Router

_REF = "#/components/schemas/{name}"


class OpenAIErrorDetail(msgspec.Struct):
    message: str
    type: str
    param: str | None
    code: str | None


class OpenAIError(msgspec.Struct):
    """The error body of every route but the KServe ones."""

    error: OpenAIErrorDetail


class KServeError(msgspec.Struct):
    """The error body of the KServe V2 routes."""

    error: str


class Status(msgspec.Struct):
    status: str


# (method, pattern) -> (summary, request body type, response type, streams SSE: True,
# or the types of its events' data)
_DESCRIBED: dict[tuple[str, str], tuple[str, Any, Any, Any]] = {
    ("GET", "/health"): ("Liveness", None, Status, False),
    ("GET", "/ready"): ("Readiness: every model loaded", None, Status, False),
    ("GET", "/metrics"): ("Prometheus metrics (text exposition)", None, None, False),
    ("GET", "/v1/models"): ("List the served models", None, s.ModelList, False),
    ("GET", "/v1/models/{model}"): ("Describe one model", None, s.ModelCard, False),
    ("POST", "/v1/chat/completions"): (
        "Chat completion (OpenAI); text/event-stream when stream is true",
        s.EngineChatRequest,
        (s.ChatCompletion, s.ToolCompletion),
        True,
    ),
    ("POST", "/v1/completions"): (
        "Text completion (OpenAI); text/event-stream when stream is true",
        s.EngineCompletionRequest,
        s.Completion,
        True,
    ),
    ("POST", "/v1/embeddings"): ("Embeddings (OpenAI)", s.EmbeddingRequest, s.EmbeddingList, False),
    ("POST", "/v1/responses"): (
        "Responses API (OpenAI, stateless); text/event-stream of Responses events when "
        "stream is true",
        rs.ResponsesRequest,
        rs.ResponseObject,
        rs.EVENT_TYPES,
    ),
    ("POST", "/v1/raw/{model}"): ("Raw bytes in, raw bytes out", None, None, False),
    ("GET", "/v2"): ("Server metadata (KServe V2)", None, ks.ServerMetadata, False),
    ("GET", "/v2/"): ("Server metadata (KServe V2)", None, ks.ServerMetadata, False),
    ("GET", "/v2/health/live"): ("Liveness (KServe V2)", None, None, False),
    ("GET", "/v2/health/ready"): ("Readiness (KServe V2)", None, None, False),
    ("GET", "/v2/models/{model}"): ("Model metadata (KServe V2)", None, ks.ModelMetadata, False),
    ("GET", "/v2/models/{model}/ready"): (
        "Model readiness (KServe V2)",
        None,
        ks.ModelReady,
        False,
    ),
    ("POST", "/v2/models/{model}/infer"): (
        "Inference (KServe V2, JSON or binary tensors)",
        ks.InferenceRequest,
        ks.InferenceResponse,
        False,
    ),
    ("GET", "/openapi.json"): ("This document", None, None, False),
    ("GET", "/v1/stats"): ("Live statistics: the /metrics values as JSON", None, None, False),
    ("GET", "/"): ("The playground and live dashboard page (HTML)", None, None, False),
    ("GET", "/ui/app.js"): ("The page's script", None, None, False),
    ("GET", "/ui/app.css"): ("The page's style sheet", None, None, False),
}


def _versioned(pattern: str) -> str:
    """The description key of a ``/versions/{version}`` route (same as unversioned)."""
    return pattern.replace("/versions/{version}", "")


def build(router: Router) -> dict[str, Any]:
    """The OpenAPI document of every route in ``router``."""
    types: list[Any] = [OpenAIError, KServeError]
    for _summary, req_t, resp_t, sse in _DESCRIBED.values():
        events = () if isinstance(sse, bool) else sse
        for t in (req_t, *(resp_t if isinstance(resp_t, tuple) else (resp_t,)), *events):
            if t is not None and t not in types:
                types.append(t)
    schemas, components = msgspec.json.schema_components(types, ref_template=_REF)
    by_type: dict[Any, Any] = dict(zip(types, schemas, strict=True))
    for _summary, _req, resp_t, _ in _DESCRIBED.values():
        if isinstance(resp_t, tuple):  # an answer of one of several shapes
            by_type[resp_t] = {"anyOf": [by_type[t] for t in resp_t]}
    paths: dict[str, dict[str, Any]] = {}
    for route in router.routes:
        key = (route.method, _versioned(route.pattern))
        summary, req_t, resp_t, sse = _DESCRIBED.get(
            key, (f"{route.method} {route.pattern}", None, None, False)
        )
        error = by_type[KServeError if route.errors == "kserve" else OpenAIError]
        op: dict[str, Any] = {
            "summary": summary,
            "operationId": f"{route.method.lower()}{route.pattern}".replace("/", "_")
            .replace("{", "")
            .replace("}", ""),
            "responses": {
                "200": _ok(
                    by_type.get(resp_t),
                    sse if isinstance(sse, bool) else {"anyOf": [by_type[e] for e in sse]},
                ),
                "4XX": {
                    "description": "Client error",
                    "content": {"application/json": {"schema": error}},
                },
                "5XX": {
                    "description": "Server error",
                    "content": {"application/json": {"schema": error}},
                },
            },
        }
        params = [seg[1:-1] for seg in route.pattern.split("/") if seg.startswith("{")]
        if params:
            op["parameters"] = [
                {"name": p, "in": "path", "required": True, "schema": {"type": "string"}}
                for p in params
            ]
        if req_t is not None:
            op["requestBody"] = {
                "required": True,
                "content": {"application/json": {"schema": by_type[req_t]}},
            }
        elif route.method == "POST":
            op["requestBody"] = {
                "required": True,
                "content": {
                    "application/octet-stream": {"schema": {"type": "string", "format": "binary"}}
                },
            }
        paths.setdefault(route.pattern, {})[route.method.lower()] = op
    return {
        "openapi": "3.1.0",
        "info": {"title": "zeroserve", "version": _version()},
        "paths": paths,
        "components": {"schemas": components},
    }


def _version() -> str:
    try:
        return metadata.version("zeroserve")
    except metadata.PackageNotFoundError:  # running from a source tree
        return "0+unknown"


def _ok(schema: Any, sse: Any) -> dict[str, Any]:
    """``sse``: True for an event stream, or the JSON Schema of each event's data."""
    content: dict[str, Any] = {}
    if schema is not None:
        content["application/json"] = {"schema": schema}
    if sse is True:
        content["text/event-stream"] = {"schema": {"type": "string"}}
    elif sse:
        # OpenAPI 3.1 cannot type an event stream's items; the events' schema is kept
        # under an extension key (and in components).
        content["text/event-stream"] = {"schema": {"type": "string"}, "x-event-data": sse}
    out: dict[str, Any] = {"description": "Success"}
    if content:
        out["content"] = content
    return out


def register(router: Router) -> None:
    """Add ``GET /openapi.json`` (call after every other route is registered)."""
    body: list[bytes] = []

    def openapi(req: Request) -> Response:
        if not body:  # built on first use, when every route is known
            body.append(msgspec.json.encode(build(router)))
        return Response(200, body, content_type=JSON)

    router.add("GET", "/openapi.json", openapi)
