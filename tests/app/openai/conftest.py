"""Fixtures of the OpenAI suite: real in-thread servers (``tests.support.ServerThread``)
and SDK clients.

* ``server``: the default models and the steered streams (``tests.support.models``), one
  per session (loading takes about a second);
* ``process_server``: ``tinyllm`` on the ``process`` executor;
* ``strict_server``: a 0.5 s request deadline and a 64 KiB body limit, on plain asyncio,
  for the 504 and 413 paths.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from pathlib import Path

import openai
import pytest

from tests.support import ServerThread
from tests.support.models import default_configs, process_configs, strict_configs
from zeroserve.edge import Edge, EdgeOptions, load_keys_file
from zeroserve.http.limits import HttpLimits
from zeroserve.runtime import ModelConfig, RuntimeOptions

# The strict server: requests die after half a second (a deadline the 504 tests need
# small, so not scaled), bodies over 64 KiB get 413.
STRICT_DEADLINE_S = 0.5
STRICT_MAX_BODY_BYTES = 64 * 1024


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


# The priority suites' keys: alice asks nothing, nightly defaults to class 500, capped
# defaults to 10 and may ask no higher than 5.
PRIORITY_KEYS = """
[keys.alice]
key = "sk-alice"

[keys.nightly]
key = "sk-nightly"
priority = 500

[keys.capped]
key = "sk-capped"
priority = 10
priority_min = 5
"""


def keyed_server(directory: Path, configs: Mapping[str, ModelConfig]) -> ServerThread:
    """An in-thread server of ``configs`` behind ``PRIORITY_KEYS`` (written to ``directory``)."""
    path = directory / "keys.toml"
    path.write_text(PRIORITY_KEYS)
    edge = Edge(EdgeOptions(keys=tuple(load_keys_file(str(path)))))
    return ServerThread(configs, edge=edge).start()
