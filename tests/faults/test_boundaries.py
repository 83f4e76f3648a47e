"""Hostile numbers, nesting and counts: each is a 400 in the API's own format, naming the
parameter, from the real server over loopback; never a 500."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest

from tests.support import ServerThread, model_scaled, scaled, start_server, wait_until
from tests.support.smollm2 import smollm2_arg
from zeroserve.app import limits as lim
from zeroserve.config import ConfigError, load_config

CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"
EMBEDDINGS = "/v1/embeddings"
V2_INFER = "/v2/models/echo/infer"
MESSAGES = [{"role": "user", "content": "hi"}]
HUGE = 10**26


def post(server: ServerThread, path: str, body: Any, **kw: Any) -> httpx.Response:
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    return httpx.post(server.url + path, content=content, timeout=scaled(30), **kw)


def openai_error(r: httpx.Response, status: int = 400) -> dict[str, Any]:
    assert r.status_code == status, r.text
    doc = r.json()
    assert set(doc) == {"error"}
    err: dict[str, Any] = doc["error"]
    assert set(err) == {"message", "type", "param", "code"}
    return err


def kserve_error(r: httpx.Response, status: int = 400) -> str:
    assert r.status_code == status, r.text
    doc = r.json()
    assert set(doc) == {"error"} and isinstance(doc["error"], str)
    return str(doc["error"])


def chat(**extra: Any) -> dict[str, Any]:
    return {"model": "tinyllm", "messages": MESSAGES, **extra}


def completion(**extra: Any) -> dict[str, Any]:
    return {"model": "tinyllm", "prompt": "hi", **extra}


# -- numeric ranges ---------------------------------------------------------------------
@pytest.mark.parametrize(
    ("path", "body", "param"),
    [
        (CHAT, chat(max_tokens=HUGE), "max_tokens"),
        (CHAT, chat(max_tokens=2**63), "max_tokens"),
        (CHAT, chat(max_tokens=lim.MAX_TOKENS + 1), "max_tokens"),
        (CHAT, chat(max_completion_tokens=2**63), "max_completion_tokens"),
        (CHAT, chat(max_tokens=HUGE, stream=True), "max_tokens"),
        (CHAT, chat(seed=2**63), "seed"),
        (CHAT, chat(seed=-(2**63) - 1), "seed"),
        (CHAT, chat(n=HUGE), "n"),
        (COMPLETIONS, completion(max_tokens=HUGE, stream=True), "max_tokens"),
        (COMPLETIONS, completion(max_tokens=2**63), "max_tokens"),
        (COMPLETIONS, completion(seed=HUGE), "seed"),
        (COMPLETIONS, completion(logprobs=HUGE), "logprobs"),
        (COMPLETIONS, completion(best_of=HUGE), "best_of"),
        (EMBEDDINGS, {"model": "echo", "input": "x", "dimensions": HUGE}, "dimensions"),
        (EMBEDDINGS, {"model": "echo", "input": "x", "dimensions": 2**63}, "dimensions"),
    ],
)
def test_huge_numbers_are_400_naming_the_parameter(
    server: ServerThread, path: str, body: dict[str, Any], param: str
) -> None:
    err = openai_error(post(server, path, body))
    assert err["param"] == param
    assert str(HUGE) not in err["message"]


def test_extreme_seeds_in_range_are_served(server: ServerThread) -> None:
    # Both ends of the int64 range, and choices past the top (seed + j wraps, not fails).
    for seed in (lim.SEED_MIN, lim.SEED_MAX):
        r = post(server, CHAT, chat(seed=seed, n=2, max_tokens=2, temperature=1.0))
        assert r.status_code == 200, r.text
        assert len(r.json()["choices"]) == 2


def test_raw_max_tokens_range(server: ServerThread) -> None:
    for value in (str(HUGE), str(2**63), "-1", "1" * 5000):
        r = httpx.post(server.url + "/v1/raw/echo?stream=1&max_tokens=" + value, content=b"x")
        err = openai_error(r)
        assert err["param"] == "max_tokens"


@pytest.mark.parametrize(
    ("shape", "needle"),
    [
        ([HUGE], "dimension above"),
        ([0, 2**62, 2**62], "elements"),
        ([0, 2**31, 2**31], "elements"),
        ([1] * (lim.MAX_TENSOR_RANK + 1), "dimensions"),
    ],
)
def test_v2_shapes_are_bounded(server: ServerThread, shape: list[int], needle: str) -> None:
    body = {"inputs": [{"name": "x", "datatype": "FP32", "shape": shape, "data": []}]}
    assert needle in kserve_error(post(server, V2_INFER, body))
    binary = {
        "inputs": [
            {
                "name": "x",
                "datatype": "BYTES",
                "shape": shape,
                "parameters": {"binary_data_size": 0},
            }
        ]
    }
    header = json.dumps(binary).encode()
    r = post(
        server, V2_INFER, header, headers={"inference-header-content-length": str(len(header))}
    )
    assert needle in kserve_error(r)


def test_v2_empty_tensor_with_big_dims_in_range_is_served(server: ServerThread) -> None:
    body = {"inputs": [{"name": "x", "datatype": "FP32", "shape": [0, 1000, 1000], "data": []}]}
    r = post(server, V2_INFER, body)
    assert r.status_code == 200, r.text
    assert r.json()["outputs"][0]["shape"] == [0, 1000, 1000]


def test_v2_timeout_parameter_range(server: ServerThread) -> None:
    body = {
        "inputs": [{"name": "x", "datatype": "INT32", "shape": [1], "data": [1]}],
        "parameters": {"timeout": HUGE},
    }
    assert "timeout" in kserve_error(post(server, V2_INFER, body))


# -- nesting ----------------------------------------------------------------------------
DEEP = 100_000


@pytest.mark.parametrize(
    "body",
    [
        b"[" * DEEP,
        b'{"model": "tinyllm", "x": ' + b"[" * DEEP,
        b'{"model": "tinyllm", "x": ' + b'{"a":' * DEEP,
        b'{"model": "tinyllm", "messages": ' + b"[" * DEEP,
    ],
)
@pytest.mark.parametrize("path", [CHAT, COMPLETIONS, EMBEDDINGS])
def test_deep_nesting_is_400_on_openai(server: ServerThread, path: str, body: bytes) -> None:
    err = openai_error(post(server, path, body))
    assert err["code"] in ("invalid_json", "invalid_request")


@pytest.mark.parametrize(
    "body",
    [
        b"[" * DEEP,
        b'{"inputs": [{"name": "x", "datatype": "INT32", "shape": [1], "data": ' + b"[" * DEEP,
        b'{"inputs": [], "parameters": {"a": ' + b'{"a":' * DEEP,
    ],
)
def test_deep_nesting_is_400_on_v2(server: ServerThread, body: bytes) -> None:
    kserve_error(post(server, V2_INFER, body))
    r = post(server, V2_INFER, body, headers={"inference-header-content-length": str(len(body))})
    kserve_error(r)


@pytest.mark.parametrize("datatype", ["BYTES", "UINT64", "INT32"])
def test_v2_data_nested_deeper_than_its_shape_is_400(server: ServerThread, datatype: str) -> None:
    depth = 900  # within the decoder's bound, far past any shape
    leaf = '"a"' if datatype == "BYTES" else str(2**64 - 1)
    data = "[" * depth + leaf + "]" * depth
    head = '{"inputs": [{"name": "x", "datatype": "' + datatype + '", "shape": [1], "data": '
    body = (head + data + "}]}").encode()
    kserve_error(post(server, V2_INFER, body))


def test_lone_surrogates_are_400(server: ServerThread) -> None:
    # JSON may spell code points that UTF-8 cannot encode; the decoder refuses them.
    bad = '"a\\ud800b"'
    cases = [
        (CHAT, '{"model": "tinyllm", "messages": [{"role": "user", "content": ' + bad + "}]}"),
        (COMPLETIONS, '{"model": "tinyllm", "max_tokens": 2, "prompt": ' + bad + "}"),
        (EMBEDDINGS, '{"model": "echo", "input": [' + bad + "]}"),
        (
            CHAT,
            '{"model": "tinyllm", "messages": ' + json.dumps(MESSAGES) + ', "stop": ' + bad + "}",
        ),
    ]
    for path, body in cases:
        err = openai_error(post(server, path, body.encode()))
        assert err["code"] == "invalid_json"
    v2 = '{"inputs": [{"name": "x", "datatype": "BYTES", "shape": [1], "data": [' + bad + "]}]}"
    kserve_error(post(server, V2_INFER, v2.encode()))


# -- counts -----------------------------------------------------------------------------
def test_embedding_inputs_are_counted(server: ServerThread) -> None:
    r = post(server, EMBEDDINGS, {"model": "echo", "input": [""] * lim.MAX_EMBEDDING_INPUTS})
    assert r.status_code == 200, r.text
    assert len(r.json()["data"]) == lim.MAX_EMBEDDING_INPUTS
    err = openai_error(
        post(server, EMBEDDINGS, {"model": "echo", "input": [""] * (lim.MAX_EMBEDDING_INPUTS + 1)})
    )
    assert (err["param"], err["code"]) == ("input", "limit_exceeded")
    assert str(lim.MAX_EMBEDDING_INPUTS) in err["message"]


@pytest.mark.parametrize(
    ("path", "body", "param"),
    [
        (CHAT, chat(messages=MESSAGES * (lim.MAX_MESSAGES + 1)), "messages"),
        (CHAT, chat(stop=["a"] * (lim.MAX_STOP + 1)), "stop"),
        (CHAT, chat(n=lim.MAX_N + 1), "n"),
        (COMPLETIONS, completion(prompt=["a"] * (lim.MAX_PROMPTS + 1)), "prompt"),
        (COMPLETIONS, completion(prompt=["a"] * 2, n=lim.MAX_N), "n"),
        (COMPLETIONS, completion(n=64, max_tokens=lim.MAX_TOKENS), "max_tokens"),
    ],
)
def test_openai_counts_are_limited(
    server: ServerThread, path: str, body: dict[str, Any], param: str
) -> None:
    err = openai_error(post(server, path, body))
    assert (err["param"], err["code"]) == (param, "limit_exceeded")


def test_v2_tensor_counts_are_limited(server: ServerThread) -> None:
    many = [
        {"name": f"x{i}", "datatype": "INT32", "shape": [1], "data": [i]}
        for i in range(lim.MAX_V2_INPUTS + 1)
    ]
    assert "input tensors" in kserve_error(post(server, V2_INFER, {"inputs": many}))
    ok = {"inputs": many[: lim.MAX_V2_INPUTS]}
    r = post(server, V2_INFER, ok)
    assert r.status_code == 200 and len(r.json()["outputs"]) == lim.MAX_V2_INPUTS
    outs = [{"name": f"y{i}"} for i in range(lim.MAX_V2_OUTPUTS + 1)]
    body = {"inputs": many[:1], "outputs": outs}
    assert "requested outputs" in kserve_error(post(server, V2_INFER, body))


# -- max_tokens: one range (fixed, representability) and one budget (configurable) -----
BUDGET = lim.MAX_OUTPUT_TOKENS  # the default ApiLimits.output_tokens
# How long a test waits for a closed stream's ticket to be released.
RELEASE_WAIT_S = 30.0


def opens_stream(url: str, path: str, body: dict[str, Any]) -> None:
    """The request is accepted: a 200 stream whose first piece arrives (then closed)."""
    with httpx.stream("POST", url + path, json=body, timeout=scaled(30)) as r:
        assert r.status_code == 200, r.read()
        assert next(piece for piece in r.iter_bytes() if piece)


def wait_released(server: ServerThread, model: str) -> None:
    wait_until(
        lambda: server.in_flight(model) == 0, RELEASE_WAIT_S, f"{model} to release its ticket"
    )


def stalled(path: str, **extra: Any) -> dict[str, Any]:
    """A streamed request to ``slowstart`` (one piece, then it waits): accepted requests
    cost nothing however many tokens they may ask for."""
    what = {"messages": MESSAGES} if path == CHAT else {"prompt": "hi"}
    return {"model": "slowstart", "stream": True, **what, **extra}


@pytest.mark.parametrize(
    ("path", "key"),
    [(CHAT, "max_tokens"), (CHAT, "max_completion_tokens"), (COMPLETIONS, "max_tokens")],
)
def test_max_tokens_budget_boundary(server: ServerThread, path: str, key: str) -> None:
    opens_stream(server.url, path, stalled(path, **{key: BUDGET}))
    err = openai_error(post(server, path, stalled(path, **{key: BUDGET + 1})))
    assert (err["param"], err["code"]) == (key, "limit_exceeded")
    assert str(BUDGET) in err["message"]
    # Choices share the budget.
    opens_stream(server.url, path, stalled(path, n=2, **{key: BUDGET // 2}))
    err = openai_error(post(server, path, stalled(path, n=2, **{key: BUDGET // 2 + 1})))
    assert (err["param"], err["code"]) == (key, "limit_exceeded")
    # Past the range the schema refuses it at decode time, naming it too.
    err = openai_error(post(server, path, stalled(path, **{key: lim.MAX_TOKENS + 1})))
    assert err["param"] == key
    wait_released(server, "slowstart")


def test_raw_max_tokens_budget_boundary(server: ServerThread) -> None:
    url = server.url + "/v1/raw/slowstart?stream=1&max_tokens="
    with httpx.stream("POST", url + str(BUDGET), content=b"x", timeout=scaled(30)) as r:
        assert r.status_code == 200
        assert next(piece for piece in r.iter_bytes() if piece)
    for value in (BUDGET + 1, lim.MAX_TOKENS + 1):
        err = openai_error(httpx.post(url + str(value), content=b"x", timeout=scaled(30)))
        assert (err["param"], err["code"]) == ("max_tokens", "limit_exceeded")
    wait_released(server, "slowstart")


def test_output_tokens_is_configurable_up_to_the_range() -> None:
    assert lim.ApiLimits(output_tokens=lim.MAX_TOKENS).output_tokens == lim.MAX_TOKENS
    with pytest.raises(ValueError, match="output_tokens"):
        lim.ApiLimits(output_tokens=lim.MAX_TOKENS + 1)
    env = {"ZEROSERVE_API_LIMITS__OUTPUT_TOKENS": str(lim.MAX_TOKENS + 1)}
    with pytest.raises(ConfigError, match="output_tokens"):
        load_config(env=env)


@pytest.mark.niced
def test_max_tokens_range_boundary_with_the_widest_budget() -> None:
    """With the budget at the range, the range itself is the boundary: ``MAX_TOKENS`` is
    accepted on every generating route, one more is a 400 naming the parameter. The
    llama.cpp engine's route refuses a request past the budget before taking a slot."""
    srv = start_server(
        "--model", "slowstart=tests.support.models.misbehaving:SlowStartModel",
        "--model", smollm2_arg(parallel=1, n_ctx=512),
        env={"ZEROSERVE_API_LIMITS__OUTPUT_TOKENS": str(lim.MAX_TOKENS)},
    )  # fmt: skip
    try:
        for path in (CHAT, COMPLETIONS):
            opens_stream(srv.url, path, stalled(path, max_tokens=lim.MAX_TOKENS))
            r = httpx.post(
                srv.url + path,
                json=stalled(path, max_tokens=lim.MAX_TOKENS + 1),
                timeout=scaled(30),
            )
            assert openai_error(r)["param"] == "max_tokens"
        raw = srv.url + "/v1/raw/slowstart?stream=1&max_tokens="
        with httpx.stream("POST", raw + str(lim.MAX_TOKENS), content=b"x", timeout=scaled(30)) as r:
            assert r.status_code == 200
        r = httpx.post(raw + str(lim.MAX_TOKENS + 1), content=b"x", timeout=scaled(30))
        assert openai_error(r)["param"] == "max_tokens"
        # The engine's route: n choices share the budget, named by the field sent.
        half = lim.MAX_TOKENS // 2 + 1
        for key, path, what in (
            ("max_tokens", CHAT, {"messages": MESSAGES}),
            ("max_completion_tokens", CHAT, {"messages": MESSAGES}),
            ("max_tokens", COMPLETIONS, {"prompt": "hi"}),
        ):
            body = {"model": "smollm2", "n": 2, key: half, **what}
            err = openai_error(httpx.post(srv.url + path, json=body, timeout=scaled(30)))
            assert (err["param"], err["code"]) == (key, "limit_exceeded")
        r = httpx.post(
            srv.url + COMPLETIONS,
            json={"model": "smollm2", "prompt": "hi", "max_tokens": 2, "temperature": 0},
            timeout=model_scaled(60),
        )
        assert r.status_code == 200, r.text
    finally:
        assert srv.stop() == 0


def test_every_gauge_is_idle_after_the_hostile_requests(server: ServerThread) -> None:
    # Runs last in this module: nothing above leaked a ticket.
    for name in ("echo", "tinyllm"):
        assert server.in_flight(name) == 0
