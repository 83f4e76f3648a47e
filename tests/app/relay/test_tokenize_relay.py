"""``/tokenize`` and ``/detokenize`` of a ``remote:`` model (docs/extensions.md): relayed
undecoded to the upstream's own routes, at its root (the base URL without ``/v1``),
the body's ``model`` rewritten to ``upstream_model``. Two real ``zeroserve serve``
processes on loopback: ``tinyllm`` upstream, ``gw`` relaying to it; httpx.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.support import ServerProcess, scaled, start_server

TEXT = "Hello world, héllo wörld!"
MESSAGES = [{"role": "user", "content": "str.split"}]


@pytest.fixture(scope="module")
def upstream() -> Iterator[ServerProcess]:
    server = start_server("--model", "tinyllm")
    yield server
    assert server.stop() == 0


@pytest.fixture(scope="module")
def gateway(upstream: ServerProcess) -> Iterator[ServerProcess]:
    server = start_server("--model", f"gw=remote:{upstream.url}/v1?upstream_model=tinyllm")
    yield server
    assert server.stop() == 0


def _post(url: str, path: str, body: dict[str, Any]) -> httpx.Response:
    return httpx.post(url + path, json=body, timeout=scaled(60))


@pytest.mark.parametrize(
    "body",
    [
        {"prompt": TEXT},
        {"content": TEXT, "add_special": True},
        {"messages": MESSAGES},
    ],
    ids=["prompt", "content", "messages"],
)
def test_tokenize_is_the_upstreams_own(
    upstream: ServerProcess, gateway: ServerProcess, body: dict[str, Any]
) -> None:
    direct = _post(upstream.url, "/tokenize", {"model": "tinyllm", **body})
    relayed = _post(gateway.url, "/tokenize", {"model": "gw", **body})
    assert direct.status_code == relayed.status_code == 200, relayed.text
    assert relayed.json() == direct.json()
    assert relayed.json()["count"] > 0


def test_detokenize_round_trips_through_the_relay(gateway: ServerProcess) -> None:
    tokens = _post(gateway.url, "/tokenize", {"model": "gw", "prompt": TEXT}).json()["tokens"]
    back = _post(gateway.url, "/detokenize", {"model": "gw", "tokens": tokens[1:]})
    assert back.status_code == 200, back.text
    assert back.json()["prompt"] == TEXT


def test_the_upstreams_refusal_comes_back_as_it_wrote_it(
    upstream: ServerProcess, gateway: ServerProcess
) -> None:
    bad = {"tokens": [1 << 30]}
    direct = _post(upstream.url, "/detokenize", {"model": "tinyllm", **bad})
    relayed = _post(gateway.url, "/detokenize", {"model": "gw", **bad})
    assert direct.status_code == relayed.status_code == 400
    mine, theirs = relayed.json()["error"], direct.json()["error"]
    assert mine["param"] == theirs["param"] == "tokens"
    assert (mine["type"], mine["code"]) == (theirs["type"], theirs["code"])
    assert mine["message"].startswith("token 1073741824 is outside the vocabulary")


def test_the_card_says_the_relay_serves_them(gateway: ServerProcess) -> None:
    """The card tells the truth: a relayed model serves both routes (its upstream's)."""
    cards = httpx.get(gateway.url + "/v1/models").json()["data"]
    card = next(c["capabilities"] for c in cards if c["id"] == "gw")
    assert card["relayed"] is True
    assert card["tokenizer"] is True
