"""Path routing: exact paths by dict lookup, patterned paths (``{name}`` segments) by a
segment-count index. Unknown path: 404; known path, wrong method: 405 with ``Allow``."""

from __future__ import annotations

from ..errors import MethodNotAllowed, NotFound
from .problems import ErrorFormat
from .request import Handler, HeadHook, Route

__all__ = ["Handler", "HeadHook", "Route", "Router"]


class Router:
    def __init__(self) -> None:
        self._exact: dict[str, dict[str, Route]] = {}
        self._patterns: dict[int, list[tuple[tuple[str, ...], dict[str, Route]]]] = {}
        self.routes: list[Route] = []

    def add(
        self,
        method: str,
        pattern: str,
        handler: Handler,
        *,
        errors: ErrorFormat = "openai",
        on_head: HeadHook | None = None,
    ) -> Route:
        route = Route(method, pattern, handler, errors, on_head, name=pattern)
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
            parts = path.strip("/").split("/")
            for segs, candidate in self._patterns.get(len(parts), ()):
                params = _match(segs, parts)
                if params:
                    methods = candidate
                    break
            if methods is None:
                raise NotFound(f"no route for {path}")
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
