"""Fixtures of the OpenAI suite: real servers (see ``openai_servers.py``) and SDK clients."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator

import pytest

import openai

HERE = os.path.dirname(os.path.abspath(__file__))
if HERE not in sys.path:
    sys.path.insert(0, HERE)

from openai_servers import (  # noqa: E402
    STRICT_DEADLINE_S,
    STRICT_MAX_BODY_BYTES,
    ServerThread,
    default_configs,
    process_configs,
    strict_configs,
)

from zeroserve.http.limits import HttpLimits  # noqa: E402
from zeroserve.runtime import RuntimeOptions  # noqa: E402


@pytest.fixture(scope="session")
def server() -> Iterator[ServerThread]:
    srv = ServerThread(default_configs()).start()
    yield srv
    srv.stop()


@pytest.fixture(scope="session")
def process_server() -> Iterator[ServerThread]:
    srv = ServerThread(process_configs()).start()
    yield srv
    srv.stop()


@pytest.fixture(scope="session")
def strict_server() -> Iterator[ServerThread]:
    srv = ServerThread(
        strict_configs(),
        runtime=RuntimeOptions(default_deadline_s=STRICT_DEADLINE_S),
        limits=HttpLimits(max_body_bytes=STRICT_MAX_BODY_BYTES),
        loop="asyncio",
    ).start()
    yield srv
    srv.stop()


@pytest.fixture
def client(server: ServerThread) -> Iterator[openai.OpenAI]:
    with server.client() as c:
        yield c
