"""Priority classes end to end (docs/architecture.md, "Priority classes"): a real server
in a thread, API keys from a keys file, the official ``openai`` SDK and httpx.

``turn`` is an embedder with one worker and batches of one, whose every call waits
until the test lets it end: so what runs next is the runtime's choice, observed in the
order the model saw the requests, with no sleeping and no timing asserted.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import openai
import pytest

from tests.app.openai.conftest import keyed_server
from tests.support import ServerThread, wait_until
from zeroserve.config import ConfigError, load_config
from zeroserve.models.base import Model
from zeroserve.models.echo import EchoModel
from zeroserve.runtime import ModelConfig

WAIT_S = 20.0


class Turnstile(Model):
    """Embeds each text as one number; each call records its first text, then waits
    for the test's turnstile before it returns."""

    executor = "thread"
    workers = 1
    max_batch_size = 1

    def __init__(self, seen: list[str] | None = None, gate: threading.Semaphore | None = None):
        super().__init__()
        assert seen is not None and gate is not None
        self.seen, self.gate = seen, gate

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        self.seen.append(texts[0])
        assert self.gate.acquire(timeout=WAIT_S), "the test never let the call end"
        return np.ones((len(texts), 2), dtype=np.float32)


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ServerThread, Any]]:
    seen: list[str] = []
    gate = threading.Semaphore(0)
    configs = {
        "turn": ModelConfig("turn", Turnstile, options={"seen": seen, "gate": gate}),
        "echo": ModelConfig("echo", EchoModel),
    }
    srv = keyed_server(tmp_path_factory.mktemp("keys"), configs)
    yield srv, (seen, gate)
    srv.stop()


def _client(srv: ServerThread, key: str) -> openai.AsyncOpenAI:
    return srv.async_client(key)


def _queued(srv: ServerThread) -> int:
    async def read() -> int:
        assert srv.engine is not None
        batches = srv.engine.model("turn").statistics().embed_batches
        assert batches is not None
        return batches.queued

    return srv.call(read())


def test_a_high_class_is_served_before_earlier_low_class_requests(
    served: tuple[ServerThread, Any],
) -> None:
    srv, (seen, gate) = served
    seen.clear()

    async def main() -> None:
        alice, nightly = _client(srv, "sk-alice"), _client(srv, "sk-nightly")

        def embed(client: openai.AsyncOpenAI, text: str, **kw: Any) -> asyncio.Task[Any]:
            return asyncio.ensure_future(client.embeddings.create(model="turn", input=text, **kw))

        calls = [embed(alice, "first")]  # runs at once, and holds the one worker
        await asyncio.to_thread(wait_until, lambda: seen == ["first"], WAIT_S, "first running")
        calls += [embed(nightly, "nightly-1"), embed(nightly, "nightly-2")]  # the key's 500
        calls.append(embed(alice, "header-700", extra_headers={"x-priority": "700"}))
        await asyncio.to_thread(wait_until, lambda: _queued(srv) == 3, WAIT_S, "three queued")
        calls.append(embed(nightly, "urgent", extra_body={"priority": -5}))  # field > key
        await asyncio.to_thread(wait_until, lambda: _queued(srv) == 4, WAIT_S, "four queued")
        for n in range(1, 6):  # end the calls one at a time
            gate.release()
            await asyncio.to_thread(
                wait_until, lambda n=n: len(seen) >= min(n + 1, 5), WAIT_S, f"call {n + 1}"
            )
        for call in calls:
            assert len((await call).data) == 1
        await alice.close()
        await nightly.close()

    asyncio.run(main())
    assert seen == ["first", "urgent", "nightly-1", "nightly-2", "header-700"]
    scrape = httpx.get(srv.url + "/metrics").text
    for cls, started in (("-5", 1), ("500", 2), ("700", 1)):
        line = f'zeroserve_class_wait_started_total{{class="{cls}",name="turn"}} {started}.0'
        assert line in scrape


@pytest.mark.parametrize(
    ("headers", "body", "param"),
    [
        ({}, {"priority": 4}, "priority"),  # above the key's cap (priority_min = 5)
        ({"x-priority": "-3"}, {}, "x-priority"),  # the same through the header
        ({}, {"priority": 1001}, "priority"),  # outside every class
        ({"x-priority": "soon"}, {}, "x-priority"),  # not a class at all
        ({"x-priority": "99999999999"}, {}, "x-priority"),
    ],
)
def test_a_class_the_key_may_not_ask_for_is_a_400_naming_it(
    served: tuple[ServerThread, Any], headers: dict[str, str], body: dict[str, Any], param: str
) -> None:
    srv, _ = served
    request = {"model": "echo", "messages": [{"role": "user", "content": "hi"}], **body}
    r = httpx.post(
        srv.url + "/v1/chat/completions",
        json=request,
        headers={"authorization": "Bearer sk-capped", **headers},
    )
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] == param and error["type"] == "invalid_request_error"
    assert "99999999999" not in error["message"]


def test_a_key_asks_at_or_below_its_cap_on_every_route(served: tuple[ServerThread, Any]) -> None:
    srv, _ = served
    auth = {"authorization": "Bearer sk-capped"}
    chat = {"model": "echo", "messages": [{"role": "user", "content": "hi"}]}
    ok = [
        ("/v1/chat/completions", {**chat, "priority": 5}, {}),
        ("/v1/completions", {"model": "echo", "prompt": "hi", "priority": 900}, {}),
        ("/v1/responses", {"model": "echo", "input": "hi", "priority": 6}, {}),
        ("/v1/embeddings", {"model": "echo", "input": "hi", "priority": 7}, {}),
        ("/v1/messages", {**chat, "max_tokens": 4}, {"x-priority": "5"}),
    ]
    for path, body, headers in ok:
        r = httpx.post(srv.url + path, json=body, headers={**auth, **headers})
        assert r.status_code == 200, (path, r.text)
    # Anthropic's and KServe's routes read the header, and refuse in their own shapes.
    r = httpx.post(
        srv.url + "/v1/messages",
        json={**chat, "max_tokens": 4},
        headers={**auth, "x-priority": "0"},
    )
    assert r.status_code == 400 and r.json()["type"] == "error"
    assert r.json()["error"]["type"] == "invalid_request_error"
    v2 = {"inputs": [{"name": "x", "shape": [1], "datatype": "FP32", "data": [1.0]}]}
    r = httpx.post(srv.url + "/v2/models/echo/infer", json=v2, headers={**auth, "x-priority": "0"})
    assert r.status_code == 400 and "x-priority" in r.json()["error"]
    r = httpx.post(srv.url + "/v2/models/echo/infer", json=v2, headers={**auth, "x-priority": "5"})
    assert r.status_code == 200, r.text


def test_the_keys_file_names_a_bad_class(tmp_path: Path) -> None:
    cases = [
        ('[keys.a]\nkey = "k"\npriority = 2000\n', "[keys.a] priority must be between"),
        ('[keys.a]\nkey = "k"\npriority_min = "high"\n', "'priority_min' must be an integer"),
        ('[keys.a]\nkey = "k"\npriority = 1\npriority_min = 3\n', "not be below 'priority_min'"),
    ]
    for text, message in cases:
        path = tmp_path / "keys.toml"
        path.write_text(text)
        cfg = load_config(env={"ZEROSERVE_EDGE__API_KEYS_FILE": str(path)})
        with pytest.raises(ConfigError) as info:
            cfg.edge.options()
        assert message in info.value.message


def test_priority_aging_is_configured_and_zero_turns_classes_off() -> None:
    cfg = load_config(env={"ZEROSERVE_RUNTIME__PRIORITY_AGING_S": "0"})
    assert cfg.runtime_options().priority_aging_s == 0.0
    with pytest.raises(ConfigError) as info:
        load_config(env={"ZEROSERVE_RUNTIME__PRIORITY_AGING_S": "-1"})
    assert "runtime.priority_aging_s" in info.value.message
