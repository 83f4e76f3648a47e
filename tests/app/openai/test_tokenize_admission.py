"""``/tokenize`` and ``/detokenize`` are model work: each takes a ticket of its model's
queue, as a chat does (docs/extensions.md). Past the queue's bound the answer is the busy
model's 429 in OpenAI's shape, with ``Retry-After``, and no ticket is left behind."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.support import ServerThread, scaled, wait_until
from tests.support.models.streams import GATES, GatedTokensModel
from zeroserve.runtime import ModelConfig

# httpx's 5 s default is too short on a busy 2-core box (a bound, not a timing assertion).
READ_TIMEOUT_S = scaled(60.0)
TOKENIZE: Any = {"model": "words", "prompt": "a b c"}
HOLD = "tokenize-admission-hold"


@pytest.fixture(scope="module")
def srv() -> Iterator[ServerThread]:
    # A gated stream holds the only ticket (queue depth 1) of a model with a tokenizer.
    config = ModelConfig("words", GatedTokensModel, queue_depth=1)
    server = ServerThread({"words": config}).start()
    yield server
    server.stop()


def _released(srv: ServerThread) -> None:
    wait_until(lambda: not srv.in_flight("words"), 30.0, "words to release its ticket")


def test_a_tokenizer_call_is_admitted_like_any_request(srv: ServerThread) -> None:
    url = srv.url
    first = httpx.post(url + "/tokenize", json=TOKENIZE, timeout=READ_TIMEOUT_S)
    assert first.status_code == 200, first.text
    tokens = first.json()["tokens"]
    _released(srv)
    GATES[HOLD] = gate = threading.Event()
    held = {"model": "words", "prompt": HOLD, "max_tokens": 3, "stream": True}
    try:
        with httpx.stream(
            "POST", url + "/v1/completions", json=held, timeout=READ_TIMEOUT_S
        ) as stream:
            assert stream.status_code == 200
            lines = stream.iter_lines()
            assert '"t0"' in next(lines)  # the first piece: the stream holds its ticket
            assert srv.in_flight("words") == 1
            for path, body in (
                ("/tokenize", TOKENIZE),
                ("/detokenize", {"model": "words", "tokens": tokens}),
            ):
                busy = httpx.post(url + path, json=body, timeout=READ_TIMEOUT_S)
                assert busy.status_code == 429, busy.text
                assert busy.json()["error"]["code"] or busy.json()["error"]["type"]
                assert busy.headers["retry-after"]
            gate.set()
            assert "[DONE]" in "".join(lines)
    finally:
        gate.set()
        del GATES[HOLD]
    _released(srv)
    again = httpx.post(url + "/tokenize", json=TOKENIZE, timeout=READ_TIMEOUT_S)
    assert again.status_code == 200, again.text
    assert again.json()["tokens"] == tokens
    back = httpx.post(
        url + "/detokenize", json={"model": "words", "tokens": tokens}, timeout=READ_TIMEOUT_S
    )
    assert back.status_code == 200, back.text
    assert back.json()["prompt"] == "a b c"
    _released(srv)


def test_a_refused_call_leaves_no_ticket(srv: ServerThread) -> None:
    r = httpx.post(srv.url + "/detokenize", json={"model": "words", "tokens": [256]}, timeout=30)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == "tokens"
    _released(srv)
    ok = httpx.post(srv.url + "/tokenize", json=TOKENIZE, timeout=READ_TIMEOUT_S)
    assert ok.status_code == 200, ok.text
