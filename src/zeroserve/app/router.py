"""Path routing: exact paths by dict lookup, patterned paths (``{name}`` segments) by a
segment-count index. Unknown path: 404; known path, wrong method: 405 with ``Allow``."""

from __future__ import annotations

from ..errors import MethodNotAllowed, NotFound
from .problems import ErrorFormat
from .request import Handler, HeadHook, Route, RouteDoc

__all__ = ["Handler", "HeadHook", "Route", "RouteDoc", "Router"]

# Patterned paths whose match is remembered (a dict lookup instead of splitting the path
# and comparing segments per request). A client can send any number of distinct paths,
# so the table is emptied when full; a server has a handful of models, so the paths it
# serves repeatedly are far fewer.
MATCHED_PATHS = 1024


class Router:
    def __init__(self) -> None:
        self._exact: dict[str, dict[str, Route]] = {}
        self._patterns: dict[int, list[tuple[tuple[str, ...], dict[str, Route]]]] = {}
        self.routes: list[Route] = []
        # Patterned paths already matched (``/v1/raw/echo``): path -> (routes, params).
        self._matched: dict[str, tuple[dict[str, Route], dict[str, str]]] = {}

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
                    raise NotFound(f"no route for {path}")
                matched = self._matched
                if len(matched) >= MATCHED_PATHS:
                    matched.clear()  # paths are the client's: the memory stays bounded
                matched[path] = (methods, dict(params))
        route = methods.get(method)
        if route is None:
            allow = sorted(methods)
            raise MethodNotAllowed(f"method {method} not allowed on {path}", allow)
        return route, params

    def route_errors(self, path: str) -> ErrorFormat:
        """The error format of the API a path belongs to (for errors before routing)."""
        if path.startswith("/v2"):
            return "kserve"
        return "openai"


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
