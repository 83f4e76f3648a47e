"""What ``/openapi.json`` says of each route, declared by the room that registers it
(docs/architecture.md, "Adding an endpoint").

A route's :class:`RouteDoc` names its request and answer types (msgspec Structs, whose
JSON Schema msgspec writes). What a Struct's schema cannot say by itself and the server
enforces all the same is a :class:`Refinement` of it: the shape of a field the schema
keeps raw (so that its size is checked before anything decodes it), the configurable
limits (``app/limits.py``), the only values served of a field the API defines more
widely, and the rules between fields. So the document says everything the server
enforces, and a client that follows it is never refused for its shape.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True, slots=True)
class Refinement:
    """What the document adds to the schema of one Struct (``type``).

    ``shapes``: field -> the type it is documented as (a field kept raw, its real shape);
    ``limits``: field -> (JSON Schema keyword, ``ApiLimits`` attribute), e.g.
    ``("maxItems", "messages")``; ``only``: field -> the JSON Schema of the values served
    (the others are refused with a 400 naming the field), with why in its description;
    ``rules``: JSON Schema ``if``/``then`` conditions between fields."""

    type: Any
    shapes: Mapping[str, Any] = field(default_factory=dict)
    limits: Mapping[str, tuple[str, str]] = field(default_factory=dict)
    only: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    rules: tuple[Mapping[str, Any], ...] = ()


@dataclass(frozen=True, slots=True)
class RouteDoc:
    """What ``/openapi.json`` says of a route: its summary, the msgspec types of its
    request and answer (a tuple: one of several shapes), whether it streams (``True``:
    SSE events of the answer's own kind; or the types of its events' data), and the
    refinements of its types' schemas. ``body``: the request body by media type (OpenAPI's
    ``content``) when it is not the JSON of ``request``; ``{}``: the route takes none."""

    summary: str
    request: Any = None
    response: Any = None
    stream: bool | tuple[Any, ...] = False
    refinements: tuple[Refinement, ...] = ()
    body: Mapping[str, Any] | None = None
