"""Path routing: exact paths by dict lookup, patterned paths (``{name}`` segments) by a
segment-count index. Unknown path: 404 naming the closest served route and the API
document; known path, wrong method: 405 with ``Allow``. Neither repeats the client's path:
error bodies never echo input."""

from __future__ import annotations

from difflib import get_close_matches

from ..errors import MethodNotAllowed, NotFound
from .apidoc import RouteDoc
from .problems import ErrorFormat
from .request import Handler, HeadHook, Route

__all__ = ["Handler", "HeadHook", "Route", "RouteDoc", "Router"]

# Patterned paths whose match is remembered (a dict lookup instead of splitting the path
# and comparing segments per request). A client can send any number of distinct paths,
# so the table is emptied when full; a server has a handful of models, so the paths it
# serves repeatedly are far fewer.
MATCHED_PATHS = 1024
# A 404 suggests the closest served route only for a path up to this long (the
# comparison is quadratic in the lengths; a served path is far shorter).
SUGGEST_MAX_PATH = 256


class Router:
    def __init__(self) -> None:
        self._exact: dict[str, dict[str, Route]] = {}
        self._patterns: dict[int, list[tuple[tuple[str, ...], dict[str, Route]]]] = {}
        self.routes: list[Route] = []
        # Patterned paths already matched (``/v1/raw/echo``): path -> (routes, params).
        self._matched: dict[str, tuple[dict[str, Route], dict[str, str]]] = {}
        # Path prefix -> the error format of the API family under it (route_errors).
        self._families: list[tuple[str, ErrorFormat]] = [("/v2", "kserve")]

    def add(
        self,
        method: str,
        pattern: str,
        handler: Handler,
        *,
        errors: ErrorFormat = "openai",
        on_head: HeadHook | None = None,
        doc: RouteDoc | None = None,
    ) -> Route:
        self._matched.clear()  # a new route may take paths matched before
        route = Route(method, pattern, handler, errors, on_head, name=pattern, doc=doc)
        self.routes.append(route)
        if "{" not in pattern:
            self._exact.setdefault(pattern, {})[method] = route
            if method == "GET":
                self._exact[pattern].setdefault("HEAD", route)
            return route
        segs = tuple(pattern.strip("/").split("/"))
        route.segments = segs
        bucket = self._patterns.setdefault(len(segs), [])
        for existing, methods in bucket:
            if existing == segs:
                methods[method] = route
                if method == "GET":
                    methods.setdefault("HEAD", route)
                return route
        methods = {method: route}
        if method == "GET":
            methods["HEAD"] = route
        bucket.append((segs, methods))
        return route

    def match(self, method: str, path: str) -> tuple[Route, dict[str, str]]:
        methods = self._exact.get(path)
        params: dict[str, str] = {}
        if methods is None:
            found = self._matched.get(path)
            if found is not None:  # a patterned path seen before: no split, no compare
                methods, params = found[0], dict(found[1])
            else:
                parts = path.strip("/").split("/")
                for segs, candidate in self._patterns.get(len(parts), ()):
                    params = _match(segs, parts)
                    if params:
                        methods = candidate
                        break
                if methods is None:
                    raise NotFound(self.not_found_message(path))
                matched = self._matched
                if len(matched) >= MATCHED_PATHS:
                    matched.clear()  # paths are the client's: the memory stays bounded
                matched[path] = (methods, dict(params))
        route = methods.get(method)
        if route is None:
            allow = sorted(methods)
            raise MethodNotAllowed(
                f"method {method} is not allowed on this path; it allows {', '.join(allow)}", allow
            )
        return route, params

    def not_found_message(self, path: str) -> str:
        """What a 404 says: the served route closest to ``path``, if one is close, and
        where the list of routes is. Only our own paths appear in it."""
        message = "no route serves this path"
        if len(path) <= SUGGEST_MAX_PATH:
            served = sorted({r.pattern for r in self.routes})
            close = get_close_matches(path, served, n=1, cutoff=0.6)
            if close:
                message += f"; the closest served route is {close[0]}"
        if "/openapi.json" in self._exact:
            message += "; GET /openapi.json lists every route"
        return message

    def route_errors(self, path: str) -> ErrorFormat:
        """The error format of the API a path belongs to (for errors before routing)."""
        for prefix, fmt in self._families:
            if path.startswith(prefix):
                return fmt
        return "openai"

    def error_family(self, prefix: str, fmt: ErrorFormat) -> None:
        """Paths under ``prefix`` belong to an API whose errors are ``fmt``: so are the
        errors answered before a route is matched (limits, keys, quotas, 404)."""
        self._families.append((prefix, fmt))


def _match(segs: tuple[str, ...], parts: list[str]) -> dict[str, str]:
    params: dict[str, str] = {}
    for seg, part in zip(segs, parts, strict=True):
        if seg.startswith("{"):
            if not part:
                return {}
            params[seg[1:-1]] = part
        elif seg != part:
            return {}
    return params
