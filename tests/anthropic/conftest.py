"""Fixtures of the Messages API suite: real servers on loopback, driven by the official
``anthropic`` SDK, httpx and raw sockets.

* ``local``: an in-thread server (the OpenAI suite's ``ServerThread``, so a test can read
  the engine's queues) with ``echo``, ``tinyllm``, ``endless`` (a stream whose close the
  test observes, queue depth 1), ``failing`` (fails after two pieces) and ``smollm2``
  (llama.cpp's engine);
* ``gateway``: a ``zeroserve serve`` process whose ``far`` is ``remote:`` to ``local``'s
  ``tinyllm`` and ``near`` to its ``smollm2``;
Clients and constants: ``messages_suite.py``. (This folder has no ``__init__.py``: with
one, ``import anthropic`` would find it instead of the SDK.)

* ``keyed``: a process serving ``echo`` behind an API key, with a small body limit.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator

import pytest
from tests.conftest import ServerProcess, start_server

HERE = os.path.dirname(os.path.abspath(__file__))
OPENAI_SUITE = os.path.join(os.path.dirname(HERE), "openai")
for path in (HERE, OPENAI_SUITE):
    if path not in sys.path:
        sys.path.insert(0, path)

from openai_servers import ServerThread, default_configs  # noqa: E402

from zeroserve.runtime import ModelConfig  # noqa: E402

pytest.importorskip("xllamacpp")

from messages_suite import KEY, SMALL_BODY_BYTES  # noqa: E402


@pytest.fixture(scope="session")
def local() -> Iterator[ServerThread]:
    from zeroserve.models.llamacpp import SmolLM2Model

    configs = {
        name: cfg
        for name, cfg in default_configs().items()
        if name in ("echo", "tinyllm", "endless", "failing")
    }
    options = {"parallel": 2, "n_ctx": 1024, "alias": "smollm2"}
    configs["smollm2"] = ModelConfig("smollm2", SmolLM2Model, options=options)
    srv = ServerThread(configs).start()
    yield srv
    srv.stop()


@pytest.fixture(scope="session")
def gateway(local: ServerThread) -> Iterator[ServerProcess]:
    server = start_server(
        "--model",
        f"far=remote:{local.url}/v1?upstream_model=tinyllm",
        "--model",
        f"near=remote:{local.url}/v1?upstream_model=smollm2",
    )
    yield server
    assert server.stop() == 0


@pytest.fixture(scope="session")
def keyed() -> Iterator[ServerProcess]:
    server = start_server(
        "--model",
        "echo",
        "--max-body-bytes",
        str(SMALL_BODY_BYTES),
        env={"ZEROSERVE_API_KEY": KEY},
    )
    yield server
    assert server.stop() == 0
