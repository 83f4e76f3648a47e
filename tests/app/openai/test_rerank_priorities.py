"""A rerank's priority class (docs/architecture.md, "Priority classes"): the body's
``priority``, ``x-priority`` and the API key's default and cap apply to ``/v1/rerank``
as to chat, on llama.cpp's slots and on the local (bi-encoder) path.

``rr`` is the built-in SmolLM2 GGUF started as llama.cpp's reranker with one slot, its
engine call held at a turnstile the test opens: so which rerank takes the slot next is
the slot pool's choice, seen in the order the engine received the queries. A real
server in a thread, keys from a keys file, httpx; no sleeping, no timing asserted.
"""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.app.openai.conftest import keyed_server
from tests.support import ServerThread, model_scaled, wait_until
from tests.support.smollm2 import require_llamacpp, smollm2_options
from zeroserve.models.echo import EchoModel
from zeroserve.models.llamacpp import SmolLM2Model
from zeroserve.runtime import ModelConfig

require_llamacpp()

WAIT_S = 60.0
# What waits on ``rr``'s engine calls (they run on its niced threads, which a busy machine
# slows far more than the suite) is bounded by this: the test's turnstile, the clients,
# and pytest-timeout for the tests marked ``niced``
# (docs/decisions/0055-model-waits-scaled-for-the-niced-share.md).
ENGINE_WAIT_S = model_scaled(WAIT_S)


class GatedReranker(SmolLM2Model):
    """SmolLM2 as a reranker whose every engine call records its query, then waits for
    the test's turnstile before the engine scores it."""

    def __init__(
        self, seen: list[str] | None = None, gate: threading.Semaphore | None = None, **o: Any
    ) -> None:
        super().__init__(**o)
        assert seen is not None and gate is not None
        self.seen, self.gate = seen, gate

    def rerank_call(self, payload: bytes) -> bytes:
        self.seen.append(json.loads(payload)["query"])
        assert self.gate.acquire(timeout=ENGINE_WAIT_S), "the test never let the call end"
        return super().rerank_call(payload)


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ServerThread, Any]]:
    seen: list[str] = []
    gate = threading.Semaphore(0)
    options = smollm2_options(parallel=1, embedding=True, pooling="rank", alias="rr")
    configs = {
        "rr": ModelConfig("rr", GatedReranker, options={**options, "seen": seen, "gate": gate}),
        "echo": ModelConfig("echo", EchoModel),
    }
    srv = keyed_server(tmp_path_factory.mktemp("keys"), configs)
    yield srv, (seen, gate)
    srv.stop()


def _queued(srv: ServerThread) -> int:
    async def read() -> int:
        assert srv.engine is not None
        slots = srv.engine.model("rr").slots
        assert slots is not None
        return slots.statistics().queued

    return srv.call(read())


@pytest.mark.niced
def test_a_high_class_rerank_takes_the_slot_before_earlier_low_ones(
    served: tuple[ServerThread, Any],
) -> None:
    srv, (seen, gate) = served
    seen.clear()

    async def main() -> list[httpx.Response]:
        async with httpx.AsyncClient(base_url=srv.url, timeout=ENGINE_WAIT_S) as http:

            def rerank(key: str, query: str, **kw: Any) -> asyncio.Task[httpx.Response]:
                body = {"model": "rr", "query": query, "documents": ["a doc"], **kw.get("body", {})}
                headers = {"authorization": f"Bearer {key}", **kw.get("headers", {})}
                return asyncio.ensure_future(http.post("/v1/rerank", json=body, headers=headers))

            calls = [rerank("sk-alice", "first")]  # takes the one slot, held at the gate
            await asyncio.to_thread(
                wait_until, lambda: seen == ["first"], WAIT_S, "first", model=True
            )
            calls.append(rerank("sk-nightly", "nightly"))  # the key's class, 500
            calls.append(rerank("sk-alice", "header-700", headers={"x-priority": "700"}))
            await asyncio.to_thread(wait_until, lambda: _queued(srv) == 2, WAIT_S, "two queued")
            calls.append(rerank("sk-nightly", "urgent", body={"priority": -5}))  # body > key
            await asyncio.to_thread(wait_until, lambda: _queued(srv) == 3, WAIT_S, "three queued")
            for n in range(1, 5):  # end the calls one at a time
                gate.release()
                await asyncio.to_thread(
                    wait_until,
                    lambda n=n: len(seen) >= min(n + 1, 4),
                    WAIT_S,
                    f"call {n + 1}",
                    model=True,
                )
            return [await c for c in calls]

    answers = asyncio.run(main())
    assert [r.status_code for r in answers] == [200] * 4, [r.text for r in answers]
    assert seen == ["first", "urgent", "nightly", "header-700"]


@pytest.mark.parametrize("model", ["rr", "echo"])
@pytest.mark.parametrize(
    ("headers", "body", "param"),
    [
        ({}, {"priority": 4}, "priority"),  # above the key's cap (priority_min = 5)
        ({"x-priority": "-3"}, {}, "x-priority"),  # the same through the header
        ({}, {"priority": 1001}, "priority"),  # outside every class
    ],
)
def test_a_rerank_class_the_key_may_not_ask_for_is_a_400_naming_it(
    served: tuple[ServerThread, Any],
    model: str,
    headers: dict[str, str],
    body: dict[str, Any],
    param: str,
) -> None:
    srv, _ = served
    request = {"model": model, "query": "q", "documents": ["d"], **body}
    r = httpx.post(
        srv.url + "/v1/rerank",
        json=request,
        headers={"authorization": "Bearer sk-capped", **headers},
    )
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] == param and error["type"] == "invalid_request_error"
    assert srv.in_flight(model) == 0


@pytest.mark.niced
def test_a_rerank_at_the_keys_cap_is_served(served: tuple[ServerThread, Any]) -> None:
    srv, (_, gate) = served
    auth = {"authorization": "Bearer sk-capped"}
    r = httpx.post(
        srv.url + "/v1/rerank",
        json={"model": "echo", "query": "q", "documents": ["d"], "priority": 5},
        headers=auth,
    )
    assert r.status_code == 200, r.text
    gate.release()  # the engine's call runs through
    r = httpx.post(
        srv.url + "/v1/rerank",
        json={"model": "rr", "query": "q", "documents": ["d"]},
        headers={**auth, "x-priority": "5"},
        timeout=ENGINE_WAIT_S,
    )
    assert r.status_code == 200, r.text
