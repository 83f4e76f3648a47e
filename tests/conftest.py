"""Fixtures every suite may use: the event-loop kinds, and a real ``echo`` server process.
The launchers and helpers are ``tests.support``'s; import them from there."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from tests.support import ServerProcess, model_slowdown, scaled, slowdown, start_server


@pytest.fixture(scope="session", params=["uvloop", "asyncio"])
def loop_name(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture(scope="session")
def echo_server(loop_name: str) -> Iterator[ServerProcess]:
    server = start_server("--model", "echo", loop=loop_name)
    yield server
    assert server.stop() == 0


# The ini ``timeout`` (quiet-machine seconds) where this run scaled it, not one given by hand.
INI_TIMEOUT = pytest.StashKey[float]()


# pytest-timeout's bounds (the ini ``timeout`` and ``@pytest.mark.timeout``) are quiet-machine
# figures too: scaled here by the suite's one factor. A ``--timeout`` or ``PYTEST_TIMEOUT``
# given by hand is taken as it is.
@pytest.hookimpl(tryfirst=True)
def pytest_configure(config: pytest.Config) -> None:
    if config.getvalue("timeout") is None and not os.environ.get("PYTEST_TIMEOUT"):
        ini = config.getini("timeout")
        if ini:
            config.option.timeout = scaled(float(ini))
            config.stash[INI_TIMEOUT] = float(ini)


def pytest_report_header() -> str:
    # The factor this run's bounds were scaled by: a failure is repeated with the same one.
    return f"ZEROSERVE_TEST_SLOWDOWN={slowdown():g}"


# A test marked ``niced`` waits on model work below the loop (llama.cpp's decode): its
# pytest-timeout bound is scaled by ``model_slowdown`` instead
# (docs/decisions/0055-model-waits-scaled-for-the-niced-share.md).
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if slowdown() == 1:
        return
    for item in items:
        niced = item.get_closest_marker("niced") is not None
        factor = model_slowdown() if niced else slowdown()
        marker = item.get_closest_marker("timeout")
        if marker is not None and marker.args and marker.args[0] is not None:
            bound = float(marker.args[0]) * factor
            item.add_marker(pytest.mark.timeout(bound, *marker.args[1:], **marker.kwargs), False)
        elif niced and INI_TIMEOUT in config.stash:
            item.add_marker(pytest.mark.timeout(config.stash[INI_TIMEOUT] * factor), False)
