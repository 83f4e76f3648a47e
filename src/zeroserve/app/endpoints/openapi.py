"""``GET /openapi.json``: an OpenAPI 3.1 description of every route, generated from the
msgspec schemas the endpoints decode and encode (``msgspec.json.schema_components``).

The document is built once, on first use, from the router's own route table, so a route
cannot be missing from it: each room describes its routes where it registers them
(``RouteDoc``); a route without one is still listed, with its method, path parameters
and error body.
msgspec writes JSON Schema 2020-12, which is OpenAPI 3.1's schema dialect.
"""

from __future__ import annotations

from importlib import metadata
from typing import Any

import msgspec

from ..anthropic.schemas import AnthropicError
from ..apidoc import Refinement, RouteDoc
from ..limits import ApiLimits
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
    """The error body of every route but the KServe and Anthropic ones."""

    error: OpenAIErrorDetail


class KServeError(msgspec.Struct):
    """The error body of the KServe V2 routes."""

    error: str


# The error body of each error format (``app/problems.py``); OpenAI's for the rest.
_ERROR_BODIES: dict[str, Any] = {"kserve": KServeError, "anthropic": AnthropicError}


def build(router: Router, limits: ApiLimits | None = None) -> dict[str, Any]:
    """The OpenAPI document of every route in ``router``, with the API limits in force."""
    limits = limits or ApiLimits()
    docs = {
        id(route): route.doc or RouteDoc(f"{route.method} {route.pattern}")
        for route in router.routes
    }
    types: list[Any] = [OpenAIError, KServeError, AnthropicError]
    refinements = [ref for doc in docs.values() for ref in doc.refinements]
    for doc in docs.values():
        resp_t, sse = doc.response, doc.stream
        events = () if isinstance(sse, bool) else sse
        for t in (doc.request, *(resp_t if isinstance(resp_t, tuple) else (resp_t,)), *events):
            if t is not None and t not in types:
                types.append(t)
    for ref in refinements:
        for t in ref.shapes.values():
            if t not in types:
                types.append(t)
    schemas, components = msgspec.json.schema_components(types, ref_template=_REF)
    by_type: dict[Any, Any] = dict(zip(types, schemas, strict=True))
    for ref in refinements:
        _refine(components[ref.type.__name__], ref, by_type, limits)
    for doc in docs.values():
        if isinstance(doc.response, tuple):  # an answer of one of several shapes
            by_type[doc.response] = {"anyOf": [by_type[t] for t in doc.response]}
    paths: dict[str, dict[str, Any]] = {}
    for route in router.routes:
        doc = docs[id(route)]
        summary, req_t, resp_t, sse = doc.summary, doc.request, doc.response, doc.stream
        error = by_type[_ERROR_BODIES.get(route.errors, OpenAIError)]
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
        if doc.body is not None:
            if doc.body:
                op["requestBody"] = {"required": True, "content": dict(doc.body)}
        elif req_t is not None:
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


def _refine(
    component: dict[str, Any], ref: Refinement, by_type: dict[Any, Any], limits: ApiLimits
) -> None:
    """What the document adds to one Struct's schema (``app/apidoc.py``)."""
    props = component["properties"]
    for name, t in ref.shapes.items():
        props[name] = {**by_type[t], **{k: v for k, v in props[name].items() if k == "default"}}
    for name, (keyword, limit) in ref.limits.items():
        bound = getattr(limits, limit)
        prop = props[name]
        if keyword in prop:
            prop[keyword] = min(prop[keyword], bound)
        else:
            prop[keyword] = bound
    for name, schema in ref.only.items():
        props[name] = {**schema, **{k: v for k, v in props[name].items() if k == "default"}}
    if ref.rules:
        component.setdefault("allOf", []).extend(ref.rules)


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


def register(router: Router, limits: ApiLimits | None = None) -> None:
    """Add ``GET /openapi.json`` (call after every other route is registered)."""
    body: list[bytes] = []

    def openapi(req: Request) -> Response:
        if not body:  # built on first use, when every route is known
            body.append(msgspec.json.encode(build(router, limits)))
        return Response(200, body, content_type=JSON)

    router.add("GET", "/openapi.json", openapi, doc=RouteDoc("This document"))
