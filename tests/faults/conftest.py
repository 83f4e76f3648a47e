"""Fixtures of the faults suite: one real server (``tests.support.ServerThread``)
with the default models, models that stall, and small limits where a test needs them."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.support import ServerThread, scaled
from tests.support.models.misbehaving import SlowStartModel, StallModel
from zeroserve.models.echo import EchoModel
from zeroserve.models.tinyllm import TinyLlamaModel
from zeroserve.runtime import ModelConfig, RuntimeOptions

# The server's request limit in the faults suite, seconds: long enough that a test which
# sees a 504 knows the client's own shorter timeout was honoured.
SERVER_DEADLINE_S = scaled(30.0)
# The per-model limit of "stall-capped": requests to it die after this, whatever the
# client asks for.
MODEL_DEADLINE_S = 0.3


def fault_configs() -> dict[str, ModelConfig]:
    return {
        "echo": ModelConfig("echo", EchoModel),
        "tinyllm": ModelConfig("tinyllm", TinyLlamaModel),
        "stall": ModelConfig("stall", StallModel),
        "stall-capped": ModelConfig("stall-capped", StallModel, deadline_s=MODEL_DEADLINE_S),
        "slowstart": ModelConfig("slowstart", SlowStartModel),
    }


# Module scope: each module stops its server, so no idle server threads outlive the
# suite into other suites' tests.
@pytest.fixture(scope="module")
def server() -> Iterator[ServerThread]:
    srv = ServerThread(
        fault_configs(), runtime=RuntimeOptions(default_deadline_s=SERVER_DEADLINE_S)
    ).start()
    yield srv
    srv.stop()
