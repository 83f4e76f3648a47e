"""Fixtures of the fuzz suite: one real server over loopback, a keep-alive client, and
the one assertion every fuzz test makes.

``ZEROSERVE_FUZZ_EXAMPLES`` sets the examples per test (CI: ``CI_EXAMPLES``); a long
campaign runs, for example, ``ZEROSERVE_FUZZ_EXAMPLES=100000 pytest tests/fuzz``. The
llama.cpp engine's tests (``test_fuzz_engine.py``) take ``ZEROSERVE_FUZZ_ENGINE_EXAMPLES``.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, settings

from tests.support import ServerThread, model_scaled, scaled
from tests.support.smollm2 import smollm2_config
from zeroserve.models.echo import EchoModel
from zeroserve.runtime import ModelConfig, RuntimeOptions
from zeroserve.server.options import KEEPALIVE_TIMEOUT_S

# Examples per fuzz test in CI: the whole suite stays well under a minute on two cores.
CI_EXAMPLES = 150
EXAMPLES = int(os.environ.get("ZEROSERVE_FUZZ_EXAMPLES", CI_EXAMPLES))
# A request the fuzzer sends may take at most this long. Echo answers in microseconds;
# these bounds are for a starved machine (a long campaign runs at nice 19 next to other
# work), where a 5 s deadline once turned scheduling delay into false 504s. A hang still
# shows as a 504 from the server's deadline, not as a stuck test.
SERVER_DEADLINE_S = scaled(60.0)
REQUEST_TIMEOUT_S = scaled(120.0)
# The client reuses an idle connection only well inside the server's keep-alive timeout.
# At the same 5 s (httpx's default), a request sent just as the server closes the idle
# connection gets no answer: the race every HTTP/1.1 client has with its server, which a
# long campaign hit once (V2 JSON, after 67,000 examples, its process starved of CPU for
# seconds between two requests; the example passed when replayed).
CLIENT_KEEPALIVE_S = KEEPALIVE_TIMEOUT_S / 5
# After a response, the server's leases and tickets are back within this long.
IDLE_WAIT_S = scaled(30.0)
# The engine fuzz runs the real model on each valid example (a second or more on a busy
# two-core machine), so it has its own count: ``ZEROSERVE_FUZZ_ENGINE_EXAMPLES``, CI
# ``CI_ENGINE_EXAMPLES``. Each request lives at most ENGINE_TIMEOUT_S (the model's own
# option; a 504 past it).
CI_ENGINE_EXAMPLES = 10
ENGINE_EXAMPLES = int(os.environ.get("ZEROSERVE_FUZZ_ENGINE_EXAMPLES", CI_ENGINE_EXAMPLES))
ENGINE_TIMEOUT_S = 10.0
# The engine's decode runs nice levels below the loop, which a busy machine slows far more
# than the suite (docs/decisions/0055-model-waits-scaled-for-the-niced-share.md): the
# client's bound and the wait for nothing to be held after an answer are scaled for that
# share. The model's own timeout above is the behaviour under test, and stays as it is.
ENGINE_REQUEST_TIMEOUT_S = model_scaled(120.0)
ENGINE_IDLE_WAIT_S = model_scaled(30.0)

settings.register_profile(
    "zeroserve-fuzz",
    max_examples=EXAMPLES,
    deadline=None,
    database=None,
    # CI runs the same examples every time; a long campaign explores at random.
    derandomize=EXAMPLES <= CI_EXAMPLES,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
settings.load_profile("zeroserve-fuzz")


class _Errors(logging.Handler):
    """Collects every ERROR record the server logs (an unhandled exception is one)."""

    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.records: list[logging.LogRecord] = []
        # Not ``self.lock``: that is logging.Handler's own, held by ``handle()`` around
        # ``emit()``; replacing it with a plain Lock made every ERROR record deadlock the
        # server thread, so a 500 showed as a hang instead of as the failure it is.
        self._guard = threading.Lock()

    def emit(self, record: logging.LogRecord) -> None:
        with self._guard:
            self.records.append(record)

    def take(self) -> list[str]:
        with self._guard:
            out = [self.format(r) for r in self.records]
            self.records.clear()
        return out


@dataclass
class Target:
    server: ServerThread
    client: httpx.Client
    errors: _Errors
    # After a response, the server's leases, tickets and slots are back within this long.
    idle_wait_s: float = IDLE_WAIT_S
    statuses: dict[int, int] = field(default_factory=dict)

    def send(self, method: str, path: str, body: bytes = b"", **kw: Any) -> httpx.Response:
        r = self.client.request(method, path, content=body, **kw)
        self.statuses[r.status_code] = self.statuses.get(r.status_code, 0) + 1
        return r

    def idle(self) -> bool:
        """No ticket held, no request queued or running, no arena lease alive, no stream."""

        async def read() -> bool:
            engine = self.server.engine
            assert engine is not None
            stats = engine.statistics()
            queues = all(m.queue.in_flight == 0 for m in stats.models.values())
            workers = all(
                m.workers.busy == 0 and m.workers.streams == 0 for m in stats.models.values()
            )
            engines = all(
                m.slots is None or (m.slots.active == 0 and m.slots.queued == 0)
                for m in stats.models.values()
            )
            idle = stats.arena.leases == 0 and stats.channels.open == 0
            return queues and workers and engines and idle

        return self.server.call(read())


# Module scope: each module stops its server, so no idle server threads outlive the
# suite into other suites' tests.
@pytest.fixture(scope="module")
def target() -> Iterator[Target]:
    yield from _serve(
        {
            "echo": ModelConfig("echo", EchoModel),
            "echo-thread": ModelConfig("echo-thread", EchoModel, executor="thread"),
        }
    )


@pytest.fixture(scope="module")
def engine_target() -> Iterator[Target]:
    """The built-in ``smollm2`` on its llama.cpp engine (the engine's own decoders and
    relay). A small context and the model's own ``timeout``: a generation the fuzzer
    left unbounded ends in seconds, with a 504."""
    yield from _serve(
        {"smollm2": smollm2_config(n_ctx=256, timeout=ENGINE_TIMEOUT_S)},
        request_timeout=ENGINE_REQUEST_TIMEOUT_S,
        idle_wait=ENGINE_IDLE_WAIT_S,
    )


def _serve(
    configs: dict[str, ModelConfig],
    request_timeout: float = REQUEST_TIMEOUT_S,
    idle_wait: float = IDLE_WAIT_S,
) -> Iterator[Target]:
    srv = ServerThread(configs, runtime=RuntimeOptions(default_deadline_s=SERVER_DEADLINE_S))
    srv.start()
    errors = _Errors()
    logger = logging.getLogger("zeroserve")
    logger.addHandler(errors)
    client = httpx.Client(
        base_url=srv.url,
        timeout=request_timeout,
        limits=httpx.Limits(keepalive_expiry=CLIENT_KEEPALIVE_S),
    )
    t = Target(srv, client, errors, idle_wait)
    try:
        yield t
    finally:
        client.close()
        logger.removeHandler(errors)
        srv.stop()
        if os.environ.get("ZEROSERVE_FUZZ_EXAMPLES"):
            print(f"\nfuzz statuses: {dict(sorted(t.statuses.items()))}")
