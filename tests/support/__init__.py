"""Shared test support, one of each: an in-thread server, a process server, a way to wait
(scaled by the suite's slowdown factor), the test models and the ``smollm2`` fixtures.

Import as ``from tests.support import ...`` (the repository root is on pytest's
``pythonpath``; ``tests`` is a package). CONTRIBUTING.md, "Tests", says where a test goes.
"""

from tests.support.inthread import ServerThread
from tests.support.process import (
    ROOT,
    ServerProcess,
    kill_group,
    serve_argv,
    server_env,
    start_server,
)
from tests.support.timing import (
    SLOWDOWN_VARIABLE,
    await_until,
    model_scaled,
    model_slowdown,
    run_async,
    scaled,
    slowdown,
    wait_until,
)

__all__ = [
    "ROOT",
    "SLOWDOWN_VARIABLE",
    "ServerProcess",
    "ServerThread",
    "await_until",
    "kill_group",
    "model_scaled",
    "model_slowdown",
    "run_async",
    "scaled",
    "serve_argv",
    "server_env",
    "slowdown",
    "start_server",
    "wait_until",
]
