"""Fixtures of the Messages API suite: real servers on loopback, driven by the official
``anthropic`` SDK, httpx and raw sockets.

* ``local``: an in-thread server (the OpenAI suite's ``ServerThread``, so a test can read
  the engine's queues) with ``echo``, ``tinyllm``, ``endless`` (a stream whose close the
  test observes, queue depth 1), ``failing`` (fails after two pieces) and ``smollm2``
  (llama.cpp's engine);
* ``gateway``: a ``zeroserve serve`` process whose ``far`` is ``remote:`` to ``local``'s
  ``tinyllm`` and ``near`` to its ``smollm2``;
Clients and constants: ``messages_suite.py``.

* ``keyed``: a process serving ``echo`` behind an API key, with a small body limit.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.app.anthropic.messages_suite import KEY, SMALL_BODY_BYTES
from tests.support import ServerProcess, ServerThread, model_scaled, start_server
from tests.support.models import default_configs
from tests.support.smollm2 import require_llamacpp, smollm2_config
from zeroserve.runtime import RuntimeOptions
from zeroserve.runtime.options import DEFAULT_DEADLINE_S

require_llamacpp()


@pytest.fixture(scope="session")
def local() -> Iterator[ServerThread]:
    configs = {
        name: cfg
        for name, cfg in default_configs().items()
        if name in ("echo", "tinyllm", "endless", "failing")
    }
    configs["smollm2"] = smollm2_config()
    # The default request deadline bounds smollm2's answers here: a quiet-machine figure,
    # scaled for the niced decode threads, the first to slow on a busy machine (decision 0055).
    runtime = RuntimeOptions(default_deadline_s=model_scaled(DEFAULT_DEADLINE_S))
    srv = ServerThread(configs, runtime=runtime).start()
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
