"""Whole (non-streamed) answers of the ``llamacpp`` backend: assembled from the engine's
chunks (app/backends/llamacpp/output.py), they match the engine's own whole answers, and a
deadline, a disconnect or SIGTERM stops their slot at the next token.

Real SmolLM2 through the real server (a subprocess, one slot: ``parallel=1``), the
official ``openai`` SDK and raw sockets. A stopped answer would otherwise run to
``LONG_TOKENS`` (over a minute on these cores), so every poll below (``POLL_S``) could
only see the slot free because the answer was stopped.
"""

from __future__ import annotations

import json
import signal
import socket
import threading
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest

from tests.edge.servers import LogSink, ManualClock
from tests.support import (
    ServerProcess,
    ServerThread,
    model_scaled,
    scaled,
    start_server,
    wait_until,
)
from tests.support.observe import model_metric
from tests.support.smollm2 import require_llamacpp
from zeroserve.edge import AccessLog, Edge, EdgeOptions
from zeroserve.edge.keys import ApiKey, KeyLimits
from zeroserve.models.llamacpp import SmolLM2Model, smollm2_path
from zeroserve.models.loader import parse_spec
from zeroserve.runtime import ModelConfig

# Waits on smollm2's decode, below the loop: bounds by model_slowdown (tests/conftest.py).
pytestmark = pytest.mark.niced

require_llamacpp()

GGUF = smollm2_path()
# Seconds within which a poll of the server's state must see what it waits for.
POLL_S = 30.0
N_CTX = 4096
# Tokens a stopped answer asks for: at SmolLM2's ~65 tokens/s on two cores, over a minute
# (more than POLL_S), so a slot seen free within POLL_S was freed by the stop.
LONG_TOKENS = 4000
# Bans SmolLM2's end tokens (<|im_end|> 2, <|endoftext|> 0): the answer runs to max_tokens.
ENDLESS = {"logit_bias": {"2": -100, "0": -100}, "temperature": 0}
HELPFUL = {"role": "system", "content": "You are a helpful assistant."}
FRANCE = {"role": "user", "content": "What is the capital of France?"}
KEY = "sk-whole-answers-0123456789"


def _spec(name: str = "one") -> str:
    return f"{name}=llamacpp:{GGUF}?parallel=1&n_ctx={N_CTX}"


@pytest.fixture(scope="module")
def llm() -> Iterator[ServerProcess]:
    server = start_server("--model", _spec())
    yield server
    assert server.stop() == 0


@pytest.fixture(scope="module")
def engine() -> Iterator[Any]:
    """The same GGUF's engine in this process: its own whole answers, to compare with."""
    model = SmolLM2Model(parallel="1", n_ctx=str(N_CTX))
    model.load()
    yield model.server


def _engine_answer(call: Any, body: dict[str, Any]) -> dict[str, Any]:
    chunks: list[Any] = []
    call(json.dumps(body).encode(), lambda c: chunks.append(c) and False)
    assert len(chunks) == 1  # a whole answer comes in one callback, at its end
    answer: dict[str, Any] = json.loads(chunks[0])
    return answer


def _metric(url: str, name: str, model: str = "one") -> float:
    return model_metric(url, name, model)


def _poll(url: str, name: str, want: float) -> None:
    """Poll (bounded by POLL_S) until the engine gauge ``name`` reads ``want``."""
    wait_until(
        lambda: _metric(url, name) == want, POLL_S, f"{name} to read {want}", 0.05, model=True
    )


def _served_at_once(url: str) -> None:
    """No slot busy, nobody waiting, and the next request is answered."""
    _poll(url, "zeroserve_engine_active", 0)
    assert _metric(url, "zeroserve_engine_queued") == 0
    r = httpx.post(
        url + "/v1/chat/completions",
        timeout=model_scaled(POLL_S),
        json={"model": "one", "messages": [HELPFUL, FRANCE], "max_tokens": 2},
    )
    assert r.status_code == 200, r.text


# -- the same answers ------------------------------------------------------------------------
def _comparable(answer: dict[str, Any]) -> dict[str, Any]:
    def logprobs(c: dict[str, Any]) -> Any:
        lp = c.get("logprobs")
        if lp is None:
            return None
        return [(t["token"], round(t["logprob"], 4)) for t in lp["content"]]

    u = answer["usage"]
    return {
        "choices": [
            (
                c.get("text", (c.get("message") or {}).get("content")),
                c["finish_reason"],
                logprobs(c),
            )
            for c in answer["choices"]
        ],
        "usage": (u["prompt_tokens"], u["completion_tokens"], u["total_tokens"]),
    }


def _without_end_token(answer: dict[str, Any]) -> dict[str, Any]:
    """The engine's whole answer with the logprob of the end token it stopped at (an
    entry with empty text) dropped: its stream never sends that token, and OpenAI's
    logprobs list only the tokens of the answer."""
    for c in answer["choices"]:
        lp = c.get("logprobs")
        if c["finish_reason"] == "stop" and lp and lp["content"][-1]["token"] == "":
            lp["content"].pop()
    return answer


def test_whole_answers_match_the_engines_own(llm: ServerProcess, engine: Any) -> None:
    chat = {
        "messages": [HELPFUL, FRANCE],
        "max_tokens": 8,
        "temperature": 0,
        "logprobs": True,
        "top_logprobs": 2,
    }
    completion = {"prompt": "The capital of France is", "max_tokens": 6, "temperature": 0}
    with llm.client() as client:
        ours_chat = client.chat.completions.create(model="one", **chat).model_dump()  # type: ignore[call-overload]
        ours_text = client.completions.create(model="one", logprobs=1, **completion).model_dump()
    theirs_chat = _engine_answer(
        engine.handle_chat_completions, {"model": "smollm2", **chat, "stream": False}
    )
    theirs_text = _engine_answer(
        engine.handle_completions, {"model": "smollm2", **completion, "logprobs": 1}
    )
    assert _comparable(ours_chat) == _comparable(_without_end_token(theirs_chat))
    assert _comparable(ours_text) == _comparable(_without_end_token(theirs_text))
    assert "Paris" in ours_chat["choices"][0]["message"]["content"]
    for ours, kind in ((ours_chat, "chat.completion"), (ours_text, "text_completion")):
        assert ours["object"] == kind
        assert ours["model"] == "one"  # the served name, never the GGUF's path
        assert ours["id"]
    # Raw: no engine-only fields, OpenAI's keys.
    raw = httpx.post(
        llm.url + "/v1/chat/completions",
        json={"model": "one", **chat},
        timeout=model_scaled(POLL_S),
    )
    assert GGUF not in raw.text and "timings" not in raw.json()
    assert set(raw.json()["choices"][0]) == {"index", "message", "logprobs", "finish_reason"}


# -- a stopped whole answer frees its slot ------------------------------------------------
@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/chat/completions", {"messages": [HELPFUL, FRANCE]}),
        ("/completions", {"prompt": "Count:", "n": 2}),  # two engine requests, one slot
    ],
)
def test_an_expired_whole_answer_frees_its_slot(
    llm: ServerProcess, path: str, body: dict[str, Any]
) -> None:
    aborted = _metric(llm.url, "zeroserve_engine_aborted")
    # The SDK's own timeout is the request's deadline (app/deadlines.py).
    with (
        openai.OpenAI(
            base_url=llm.url + "/v1", api_key="unused", max_retries=0, timeout=scaled(2.0)
        ) as client,
        pytest.raises(openai.InternalServerError) as info,
    ):
        client.post(
            path,
            body={"model": "one", "max_tokens": LONG_TOKENS, **ENDLESS, **body},
            cast_to=httpx.Response,
        )
    assert info.value.status_code == 504
    assert info.value.response.json()["error"]["code"] == "deadline_exceeded"
    _served_at_once(llm.url)
    assert _metric(llm.url, "zeroserve_engine_aborted") > aborted


def _request(port: int, body: dict[str, Any]) -> socket.socket:
    data = json.dumps(body).encode()
    sock = socket.create_connection(("127.0.0.1", port), timeout=model_scaled(POLL_S))
    sock.sendall(
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        b"Content-Length: %d\r\n\r\n%s" % (len(data), data)
    )
    return sock


def test_a_disconnect_mid_whole_answer_frees_its_slot(llm: ServerProcess) -> None:
    aborted = _metric(llm.url, "zeroserve_engine_aborted")
    body = {"model": "one", "messages": [HELPFUL, FRANCE], "max_tokens": LONG_TOKENS, **ENDLESS}
    sock = _request(llm.port, body)
    try:
        _poll(llm.url, "zeroserve_engine_active", 1)  # the answer is being made
    finally:
        sock.close()
    _served_at_once(llm.url)
    assert _metric(llm.url, "zeroserve_engine_aborted") > aborted


def test_sigterm_drains_while_a_whole_answer_runs() -> None:
    """The grace period (2 s here) ends the answer's connection; its slot stops at the
    next token, so the process exits 0 well before the answer would have ended."""
    server = start_server("--model", _spec(), env={"ZEROSERVE_TIMEOUTS__GRACEFUL": "2"})
    try:
        body = {
            "model": "one",
            "messages": [HELPFUL, FRANCE],
            "max_tokens": LONG_TOKENS,
            **ENDLESS,
        }
        outcome: list[BaseException | httpx.Response] = []

        def ask() -> None:
            try:
                outcome.append(
                    httpx.post(
                        server.url + "/v1/chat/completions", json=body, timeout=model_scaled(POLL_S)
                    )
                )
            except httpx.HTTPError as exc:
                outcome.append(exc)

        client = threading.Thread(target=ask)
        client.start()
        _poll(server.url, "zeroserve_engine_active", 1)
        server.proc.send_signal(signal.SIGTERM)
        assert server.proc.wait(model_scaled(POLL_S)) == 0
        client.join(model_scaled(POLL_S))
        assert outcome and isinstance(outcome[0], httpx.HTTPError)  # cut, never a 200
    finally:
        server.stop()


# -- n > 1: the edge sees the model and its tokens ---------------------------------------
def _edge_server(edge: Edge) -> ServerThread:
    spec = parse_spec(_spec("g"))
    configs = {"g": ModelConfig("g", spec.load_class(), options=spec.options, **spec.runtime)}
    return ServerThread(configs, edge=edge).start()


def test_n_choices_are_logged_with_their_tokens() -> None:
    sink = LogSink()
    server = _edge_server(Edge(access_log=AccessLog(stream=sink)))
    try:
        r = server.client().completions.create(
            model="g",
            prompt="The capital of France is",
            max_tokens=3,
            n=2,
            temperature=0.8,
            seed=1,
            extra_headers={"x-request-id": "engine-n2"},
        )
        assert [c.index for c in r.choices] == [0, 1]
        assert r.usage is not None
        text = sink.wait_for_text(b'"engine-n2"')
        rec = next(json.loads(x) for x in text.splitlines() if b'"engine-n2"' in x)
        assert rec["model"] == "g" and rec["status"] == 200
        assert rec["tokens"] == r.usage.total_tokens  # the prompt once, as usage counts it
    finally:
        server.stop()


def test_n_choices_count_against_the_keys_tokens_per_minute() -> None:
    key = ApiKey("user", KEY.encode(), KeyLimits(tokens_per_minute=10))
    server = _edge_server(Edge(EdgeOptions(keys=(key,)), clock=ManualClock()))
    try:
        client = server.client(KEY)
        r = client.completions.create(model="g", prompt="a b c d e f", max_tokens=4, n=2)
        assert r.usage is not None and r.usage.total_tokens > 10
        with pytest.raises(openai.RateLimitError) as info:
            client.completions.create(model="g", prompt="a", max_tokens=1)
        assert int(info.value.response.headers["retry-after"]) > 0
        assert server.edge.statistics()["user"].tokens > 10
    finally:
        server.stop()
