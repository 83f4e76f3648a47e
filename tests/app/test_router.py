"""The router: exact and patterned paths, 404 and 405, and the table of patterned paths
already matched (app/router.py)."""

from __future__ import annotations

import pytest

from zeroserve.app.request import Request
from zeroserve.app.response import Response
from zeroserve.app.router import MATCHED_PATHS, Router
from zeroserve.errors import MethodNotAllowed, NotFound


def _ok(req: Request) -> Response:
    return Response(200)


def _router() -> Router:
    router = Router()
    router.add("GET", "/health", _ok)
    router.add("POST", "/v1/raw/{model}", _ok)
    router.add("GET", "/v2/models/{name}/versions/{version}", _ok)
    return router


def test_a_patterned_path_matches_the_same_every_time_with_its_own_params() -> None:
    router = _router()
    route, params = router.match("POST", "/v1/raw/echo")
    assert route.pattern == "/v1/raw/{model}" and params == {"model": "echo"}
    params["model"] = "changed by a handler"
    again, params2 = router.match("POST", "/v1/raw/echo")
    assert again is route and params2 == {"model": "echo"}
    _, two = router.match("GET", "/v2/models/m/versions/3")
    assert two == {"name": "m", "version": "3"}


def test_a_remembered_path_still_refuses_other_methods_and_unknown_paths_stay_404() -> None:
    router = _router()
    router.match("POST", "/v1/raw/echo")
    with pytest.raises(MethodNotAllowed) as refused:
        router.match("GET", "/v1/raw/echo")
    assert refused.value.allow == ["POST"]
    for _ in range(2):
        with pytest.raises(NotFound):
            router.match("POST", "/v1/raw/echo/extra")


def test_more_distinct_paths_than_the_table_holds_all_match() -> None:
    router = _router()
    names = [f"m{i}" for i in range(MATCHED_PATHS * 2 + 5)]
    for _ in range(2):
        for name in names:
            assert router.match("POST", f"/v1/raw/{name}")[1] == {"model": name}


def test_a_route_added_later_is_found() -> None:
    router = _router()
    router.match("POST", "/v1/raw/echo")
    router.add("GET", "/v1/raw/{model}", _ok)
    route, params = router.match("GET", "/v1/raw/echo")
    assert route.method == "GET" and params == {"model": "echo"}
