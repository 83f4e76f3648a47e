"""Deadlines on every route, over loopback: the client's own timeout (the openai SDK's
``timeout=``, raw ``?timeout=`` / ``Request-Timeout``, V2 ``parameters.timeout``), the
model's ``deadline_s`` and the server's ``--request-timeout``; each expired request is a
504 in its API's format, and a stream ends with an error event.

The server's own limit here is ``SERVER_DEADLINE_S`` (30 s) and every client gives up
after ``CLIENT_WAIT_S`` (10 s): a 504 can only come from the shorter deadline asked for.
"""

from __future__ import annotations

import json
import sys
from typing import Any

import httpx
import openai
import pytest

from tests.faults.conftest import MODEL_DEADLINE_S, SERVER_DEADLINE_S
from tests.support import ServerProcess, ServerThread, model_scaled, scaled, start_server
from tests.support.smollm2 import smollm2_arg
from zeroserve.app import limits as lim
from zeroserve.config import ConfigError, load_config

# A client waits at most this long for any answer: well under the server's limit.
CLIENT_WAIT_S = scaled(10.0)
MESSAGES = [{"role": "user", "content": "hi"}]
assert CLIENT_WAIT_S < SERVER_DEADLINE_S


def sdk(server: ServerThread, timeout: float) -> openai.OpenAI:
    return openai.OpenAI(
        base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=timeout
    )


def openai_504(r: httpx.Response) -> dict[str, Any]:
    assert r.status_code == 504, r.text
    err: dict[str, Any] = r.json()["error"]
    assert err["code"] == "deadline_exceeded"
    return err


# The stainless timeout header that cuts the ``slowstart`` model's stream mid-generation.
CUT_AT = {"x-stainless-timeout": "0.5"}


def sse_data(
    server: ServerThread, body: dict[str, Any], headers: dict[str, str] | None = None
) -> list[str]:
    """The ``data:`` payloads of one streamed chat completion (its head must be a 200)."""
    with httpx.stream(
        "POST",
        server.url + "/v1/chat/completions",
        json={**body, "stream": True},
        headers=headers,
        timeout=CLIENT_WAIT_S,
    ) as r:
        assert r.status_code == 200
        return [line[6:] for line in r.iter_lines() if line.startswith("data: ")]


# -- OpenAI: the SDK's own timeout ------------------------------------------------------
def test_sdk_timeout_bounds_chat(server: ServerThread) -> None:
    client = sdk(server, timeout=scaled(2.0))
    with pytest.raises(openai.InternalServerError) as info:
        client.chat.completions.create(model="stall", messages=MESSAGES)  # type: ignore[arg-type]
    assert info.value.status_code == 504
    assert info.value.response.json()["error"]["code"] == "deadline_exceeded"
    assert server.in_flight("stall") == 0


def test_sdk_timeout_bounds_completions_and_embeddings(server: ServerThread) -> None:
    client = sdk(server, timeout=scaled(2.0))
    with pytest.raises(openai.InternalServerError) as info:
        client.completions.create(model="stall", prompt="x")
    assert info.value.status_code == 504
    with pytest.raises(openai.InternalServerError) as info:
        client.embeddings.create(model="stall", input=["x"])
    assert info.value.status_code == 504
    assert server.in_flight("stall") == 0


def test_stainless_timeout_header_ends_a_stream_with_an_error_event(
    server: ServerThread,
) -> None:
    events = sse_data(server, {"model": "slowstart", "messages": MESSAGES}, CUT_AT)
    docs = [json.loads(e) for e in events if e != "[DONE]"]
    contents = [d["choices"][0]["delta"].get("content") for d in docs if d.get("choices")]
    assert "first" in contents
    assert docs[-1]["error"]["code"] == "deadline_exceeded"
    assert server.in_flight("slowstart") == 0


def test_a_stream_cut_by_its_deadline_leaves_no_exception_behind(server: ServerThread) -> None:
    # The cut stream's cancellation passes through handlers that close generators. On the
    # compiled build an await inside such a handler left its CancelledError as the loop
    # thread's handled exception, and every later OpenAI request on the server re-raised
    # it and hung (docs/decisions/0009-no-await-in-handlers-when-compiled.md).
    last = sse_data(server, {"model": "slowstart", "messages": MESSAGES}, CUT_AT)[-1]
    assert json.loads(last)["error"]["code"] == "deadline_exceeded"

    async def handled() -> str:
        return repr(sys.exc_info()[1])

    assert server.call(handled()) == "None"
    whole = httpx.post(
        server.url + "/v1/completions",
        json={"model": "echo", "prompt": "x y", "max_tokens": 4},
        timeout=CLIENT_WAIT_S,
    )
    assert whole.status_code == 200, whole.text
    assert whole.json()["choices"][0]["text"]
    two = httpx.post(
        server.url + "/v1/chat/completions",
        json={"model": "echo", "messages": MESSAGES, "max_tokens": 4, "n": 2},
        timeout=CLIENT_WAIT_S,
    )
    assert two.status_code == 200, two.text
    assert [c["index"] for c in two.json()["choices"]] == [0, 1]
    streamed = sse_data(server, {"model": "echo", "messages": MESSAGES, "max_tokens": 4})
    assert streamed[-1] == "[DONE]"
    assert server.in_flight("slowstart") == server.in_flight("echo") == 0


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/completions"])
def test_stream_whose_deadline_passed_before_it_started_is_a_504(
    server: ServerThread, path: str
) -> None:
    # A stream's first choice starts in the I/O callback that completed the request; a
    # deadline already past there (a tiny SDK timeout) is the 504 answer, not a dropped
    # connection and a leaked ticket (found by the long fuzz campaign).
    body: dict[str, Any] = {"model": "echo", "stream": True, "max_tokens": 4}
    body.update({"messages": MESSAGES} if "chat" in path else {"prompt": "x"})
    for _ in range(3):  # the connection and the server keep serving
        r = httpx.post(
            server.url + path,
            json=body,
            headers={"x-stainless-timeout": "1e-300"},
            timeout=CLIENT_WAIT_S,
        )
        openai_504(r)
    assert server.in_flight("echo") == 0


def test_read_timeout_header_does_not_cut_a_stream(server: ServerThread) -> None:
    # A read timeout restarts with every piece the client receives: it is not a deadline
    # for a whole stream (only X-Stainless-Timeout is).
    body = {"model": "tinyllm", "prompt": "hello", "stream": True, "max_tokens": 8}
    with httpx.stream(
        "POST",
        server.url + "/v1/completions",
        json=body,
        headers={"x-stainless-read-timeout": "0.000001"},
        timeout=CLIENT_WAIT_S,
    ) as r:
        text = "".join(r.iter_text())
    assert r.status_code == 200
    assert "deadline_exceeded" not in text and text.rstrip().endswith("data: [DONE]")


def test_model_deadline_caps_the_clients(server: ServerThread) -> None:
    # stall-capped lives at most MODEL_DEADLINE_S whatever the client asks for.
    client = sdk(server, timeout=CLIENT_WAIT_S)
    with pytest.raises(openai.InternalServerError) as info:
        client.chat.completions.create(model="stall-capped", messages=MESSAGES)  # type: ignore[arg-type]
    assert info.value.status_code == 504
    r = httpx.post(
        server.url + "/v1/raw/stall-capped?timeout=20", content=b"x", timeout=CLIENT_WAIT_S
    )
    openai_504(r)
    assert MODEL_DEADLINE_S < CLIENT_WAIT_S


def test_malformed_sdk_header_is_ignored(server: ServerThread) -> None:
    r = httpx.post(
        server.url + "/v1/chat/completions",
        json={"model": "echo", "messages": MESSAGES},
        headers={"x-stainless-timeout": "soon"},
        timeout=CLIENT_WAIT_S,
    )
    assert r.status_code == 200


# -- raw ----------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("suffix", "headers"),
    [("?timeout=0.3", {}), ("", {"request-timeout": "0.3"}), ("?stream=1&timeout=0.3", {})],
)
def test_raw_timeout(server: ServerThread, suffix: str, headers: dict[str, str]) -> None:
    r = httpx.post(
        server.url + "/v1/raw/stall" + suffix,
        content=b"x",
        headers=headers,
        timeout=CLIENT_WAIT_S,
    )
    openai_504(r)
    assert server.in_flight("stall") == 0


@pytest.mark.parametrize("value", ["abc", "0", "-1", "nan", "inf", "1e9"])
def test_raw_bad_timeout_is_400(server: ServerThread, value: str) -> None:
    for url, headers in (
        (f"/v1/raw/echo?timeout={value}", {}),
        ("/v1/raw/echo", {"request-timeout": value}),
    ):
        r = httpx.post(server.url + url, content=b"x", headers=headers, timeout=CLIENT_WAIT_S)
        assert r.status_code == 400, r.text
        assert r.json()["error"]["param"] in ("timeout", "request-timeout")
    assert server.in_flight("echo") == 0


def test_raw_timeout_that_is_not_reached_serves(server: ServerThread) -> None:
    r = httpx.post(server.url + "/v1/raw/echo?timeout=5", content=b"abc", timeout=CLIENT_WAIT_S)
    assert (r.status_code, r.content) == (200, b"abc")


# -- KServe V2 ----------------------------------------------------------------------------
def test_v2_timeout_parameter(server: ServerThread) -> None:
    body = {
        "inputs": [{"name": "x", "datatype": "INT32", "shape": [1], "data": [1]}],
        "parameters": {"timeout": 300_000},
    }
    r = httpx.post(server.url + "/v2/models/stall/infer", json=body, timeout=CLIENT_WAIT_S)
    assert r.status_code == 504, r.text
    assert set(r.json()) == {"error"} and isinstance(r.json()["error"], str)
    assert server.in_flight("stall") == 0


# -- the server's own limit ----------------------------------------------------------------
def test_request_timeout_flag_and_model_option() -> None:
    srv = start_server(
        "--request-timeout", "0.5",
        "--model", "stall=tests.support.models.misbehaving:StallModel",
        "--model", "capped=tests.support.models.misbehaving:StallModel?deadline_s=0.2",
        "--model", "echo",
    )  # fmt: skip
    try:
        for model in ("stall", "capped"):
            r = httpx.post(f"{srv.url}/v1/raw/{model}", content=b"x", timeout=CLIENT_WAIT_S)
            openai_504(r)
            # The client cannot lengthen the server's limit.
            r = httpx.post(
                f"{srv.url}/v1/raw/{model}?timeout=60", content=b"x", timeout=CLIENT_WAIT_S
            )
            openai_504(r)
        r = httpx.post(f"{srv.url}/v1/raw/echo", content=b"ok", timeout=CLIENT_WAIT_S)
        assert r.content == b"ok"
    finally:
        assert srv.stop() == 0


def test_request_timeout_config_key_and_env() -> None:
    assert load_config(env={}).runtime_options().default_deadline_s == 300.0
    cfg = load_config(env={"ZEROSERVE_RUNTIME__DEFAULT_DEADLINE_S": "2.5"})
    assert cfg.runtime_options().default_deadline_s == 2.5
    cfg = load_config(env={}, overrides={"runtime": {"default_deadline_s": 7}})
    assert cfg.runtime_options().default_deadline_s == 7.0
    with pytest.raises(ConfigError, match=r"runtime\.default_deadline_s"):
        load_config(env={"ZEROSERVE_RUNTIME__DEFAULT_DEADLINE_S": "0"})
    cfg = load_config(env={"ZEROSERVE_RUNTIME__HANG_GRACE_S": "1.5"})
    assert cfg.runtime_options().hang_grace_s == 1.5
    with pytest.raises(ConfigError, match=r"runtime\.hang_grace_s"):
        load_config(env={"ZEROSERVE_RUNTIME__HANG_GRACE_S": "-1"})


def test_api_limits_config_key() -> None:
    cfg = load_config(env={"ZEROSERVE_API_LIMITS__EMBEDDING_INPUTS": "16"})
    assert cfg.app_limits().embedding_inputs == 16
    with pytest.raises(ConfigError, match="positive"):
        load_config(env={"ZEROSERVE_API_LIMITS__MESSAGES": "0"})


# -- the llama.cpp engine's route (the built-in smollm2) ----------------------------------
# Bans SmolLM2's end tokens, so a generation runs to max_tokens and surely outlives the
# deadlines below.
LONG = {"max_tokens": 1900, "temperature": 0, "logit_bias": {"2": -100, "0": -100}}
ENGINE_LIMIT_S = 3.0  # the server's --request-timeout in the second test
# A client's wait for an answer the niced decode threads make (one token, after the prompt).
ENGINE_WAIT_S = model_scaled(10.0)


def _engine(*args: str) -> ServerProcess:
    pytest.importorskip("xllamacpp")
    # One slot: an expired request's slot stops at its next token, so each request
    # below finds it free, and the server then stops gracefully.
    return start_server(*args, "--model", smollm2_arg(parallel=1, n_ctx=4096))


@pytest.mark.niced
def test_engine_route_honours_the_sdk_timeout() -> None:
    srv = _engine("--request-timeout", str(SERVER_DEADLINE_S))
    try:
        # /v1/responses shares the engine's output-token budget (app/limits.py).
        def respond(max_output_tokens: int) -> httpx.Response:
            body = {"model": "smollm2", "input": "hi", "max_output_tokens": max_output_tokens}
            return httpx.post(srv.url + "/v1/responses", json=body, timeout=ENGINE_WAIT_S)

        r = respond(lim.MAX_OUTPUT_TOKENS + 1)
        assert r.status_code == 400, r.text
        err = r.json()["error"]
        assert (err["param"], err["code"]) == ("max_output_tokens", "limit_exceeded")
        r = respond(1)
        assert r.status_code == 200, r.text
        # The SDK's own timeout: any 504 within CLIENT_WAIT_S comes from it.
        client = openai.OpenAI(
            base_url=srv.url + "/v1", api_key="unused", max_retries=0, timeout=scaled(2.0)
        )
        with pytest.raises(openai.InternalServerError) as info:
            client.chat.completions.create(
                model="smollm2",
                messages=MESSAGES,  # type: ignore[arg-type]
                extra_body=LONG,
            )
        assert info.value.status_code == 504
        assert info.value.response.json()["error"]["code"] == "deadline_exceeded"
        # A stream with the whole-request header: a 504 before its head, or a final
        # error event after it.
        body = {"model": "smollm2", "prompt": "Count:", "stream": True, **LONG}
        with httpx.stream(
            "POST",
            srv.url + "/v1/completions",
            json=body,
            headers={"x-stainless-timeout": "2"},
            timeout=CLIENT_WAIT_S,
        ) as r:
            if r.status_code == 200:
                events = [line[6:] for line in r.iter_lines() if line.startswith("data: ")]
                assert json.loads(events[-1])["error"]["code"] == "deadline_exceeded"
            else:
                r.read()
                openai_504(r)

    finally:
        assert srv.stop() == 0


@pytest.mark.niced
def test_engine_route_is_capped_by_the_request_timeout() -> None:
    srv = _engine("--request-timeout", str(ENGINE_LIMIT_S))
    try:
        r = httpx.post(
            srv.url + "/v1/chat/completions",
            json={"model": "smollm2", "messages": MESSAGES, **LONG},
            timeout=CLIENT_WAIT_S,
        )
        openai_504(r)
        assert ENGINE_LIMIT_S < CLIENT_WAIT_S
    finally:
        assert srv.stop() == 0
