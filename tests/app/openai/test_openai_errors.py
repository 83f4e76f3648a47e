"""Every error class, in OpenAI's body, with the status the SDK maps to its exception."""

from __future__ import annotations

from typing import Any

import httpx
import openai
import pytest

from tests.support import ServerThread, scaled
from tests.support.models.streams import CLOSED
from zeroserve.app.openai.schemas import MAX_ECHOED_MESSAGE_CHARS, MAX_ECHOED_PARAM_CHARS

CHAT = "/v1/chat/completions"
MESSAGES = [{"role": "user", "content": "hi"}]
# Any test that waits for the server to do something gives up after this long.
WAIT_S = scaled(10.0)


def post(server: ServerThread, path: str, body: Any) -> httpx.Response:
    if isinstance(body, bytes):
        return httpx.post(server.url + path, content=body)
    return httpx.post(server.url + path, json=body)


def error_of(r: httpx.Response) -> dict[str, Any]:
    doc = r.json()
    assert set(doc) == {"error"}
    err: dict[str, Any] = doc["error"]
    assert set(err) == {"message", "type", "param", "code"}
    return err


def test_unknown_model_is_404(client: openai.OpenAI, server: ServerThread) -> None:
    with pytest.raises(openai.NotFoundError) as info:
        client.chat.completions.create(model="secret-model-name", messages=MESSAGES)  # type: ignore[arg-type]
    assert "secret-model-name" not in info.value.response.text
    err = error_of(info.value.response)
    assert (err["code"], err["param"]) == ("model_not_found", "model")
    with pytest.raises(openai.NotFoundError):
        client.embeddings.create(model="nope", input="x")
    with pytest.raises(openai.NotFoundError):
        client.completions.create(model="nope", prompt="x")


@pytest.mark.parametrize(
    ("body", "param"),
    [
        (b"{not json", None),
        (b"", None),
        (b"[1, 2]", None),
        ({"messages": MESSAGES}, "model"),
        ({"model": "tinyllm"}, "messages"),
        ({"model": "tinyllm", "messages": []}, "messages"),
        ({"model": "tinyllm", "messages": "hi"}, "messages"),
        ({"model": "tinyllm", "messages": [{"content": "hi"}]}, "messages[0].role"),
        ({"model": "tinyllm", "messages": MESSAGES, "max_tokens": -1}, "max_tokens"),
        ({"model": "tinyllm", "messages": MESSAGES, "max_tokens": "5"}, "max_tokens"),
        (
            {"model": "tinyllm", "messages": MESSAGES, "max_completion_tokens": 0},
            "max_completion_tokens",
        ),
        ({"model": "tinyllm", "messages": MESSAGES, "temperature": 2.5}, "temperature"),
        ({"model": "tinyllm", "messages": MESSAGES, "top_p": 1.5}, "top_p"),
        ({"model": "tinyllm", "messages": MESSAGES, "n": 0}, "n"),
        ({"model": "tinyllm", "messages": MESSAGES, "stop": ["a", "b", "c", "d", "e"]}, "stop"),
        ({"model": "tinyllm", "messages": MESSAGES, "stream": "yes"}, "stream"),
        ({"model": "tinyllm", "messages": MESSAGES, "logprobs": True}, "logprobs"),
        ({"model": "tinyllm", "messages": MESSAGES, "max_tokens": 100000}, "messages"),
        (
            {
                "model": "tinyllm",
                "messages": [{"role": "user", "content": [{"type": "image_url"}]}],
            },
            "messages[0].content[0]",
        ),
        ({"model": "minilm", "messages": MESSAGES}, "model"),
    ],
)
def test_chat_bad_request_is_400(server: ServerThread, body: Any, param: str | None) -> None:
    r = post(server, CHAT, body)
    assert r.status_code == 400, r.text
    err = error_of(r)
    assert err["type"] == "invalid_request_error"
    assert err["param"] == param


@pytest.mark.parametrize(
    ("path", "body", "param"),
    [
        ("/v1/completions", {"model": "echo", "prompt": [1, 2, 3]}, "prompt"),
        ("/v1/completions", {"model": "echo", "prompt": "x", "echo": True}, "echo"),
        ("/v1/completions", {"model": "echo", "prompt": "x", "max_tokens": -3}, "max_tokens"),
        ("/v1/completions", {"model": "minilm", "prompt": "x"}, "model"),
        ("/v1/embeddings", {"model": "minilm", "input": []}, "input"),
        (
            "/v1/embeddings",
            {"model": "minilm", "input": "x", "encoding_format": "hex"},
            "encoding_format",
        ),
        ("/v1/embeddings", {"model": "minilm", "input": "x", "dimensions": 0}, "dimensions"),
        ("/v1/embeddings", {"model": "tinyllm", "input": "x"}, "model"),
        ("/v1/embeddings", {"model": "minilm"}, "input"),
    ],
)
def test_other_bad_requests_are_400(server: ServerThread, path: str, body: Any, param: str) -> None:
    r = post(server, path, body)
    assert r.status_code == 400, r.text
    assert error_of(r)["param"] == param


def test_sdk_raises_bad_request(client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(model="tinyllm", messages=MESSAGES, temperature=3)  # type: ignore[arg-type]
    assert info.value.param == "temperature"  # type: ignore[attr-defined]


def test_error_bodies_never_echo_input(server: ServerThread) -> None:
    secret = "S3CRET-payload-value"
    bodies: list[Any] = [
        b'{"model": "' + secret.encode() + b'", "messages": [',
        {"model": secret, "messages": MESSAGES},
        {"model": "tinyllm", "messages": [{"role": secret, "content": "x"}]},
        {"model": "tinyllm", "messages": MESSAGES, "stop": {secret: 1}},
        {"model": "tinyllm", "messages": [{"role": "user", "content": [{"type": secret}]}]},
        {"model": "minilm", "input": "x", "encoding_format": secret},
    ]
    for body in bodies:
        for path in (CHAT, "/v1/embeddings"):
            r = post(server, path, body)
            assert r.status_code in (400, 404)
            assert secret not in r.text


@pytest.mark.parametrize("key", ["k" * 5000, "a`b" * 2000, "x" * MAX_ECHOED_PARAM_CHARS])
def test_an_unknown_parameter_is_named_within_a_bound(server: ServerThread, key: str) -> None:
    """A parameter's name is the client's input: the 400 names it, cut to a bound."""
    r = post(server, CHAT, {"model": "tinyllm", "messages": MESSAGES, key: 1})
    assert r.status_code == 400
    err = error_of(r)
    param = err["param"]
    assert len(param) <= MAX_ECHOED_PARAM_CHARS
    if len(key) <= MAX_ECHOED_PARAM_CHARS:
        assert param == key  # a name within the bound is shown whole
    else:
        assert param.endswith("\u2026") and key.startswith(param[:-1])
    assert len(r.content) < 2 * MAX_ECHOED_PARAM_CHARS + MAX_ECHOED_MESSAGE_CHARS + 200


def test_wrong_method_is_405(server: ServerThread) -> None:
    r = httpx.get(server.url + CHAT)
    assert r.status_code == 405
    assert "POST" in r.headers["allow"]
    error_of(r)


def test_overload_is_429_and_the_slot_comes_back(server: ServerThread) -> None:
    with server.client() as c:
        stream = c.chat.completions.create(model="endless", messages=MESSAGES, stream=True)  # type: ignore[arg-type]
        next(iter(stream))
        with pytest.raises(openai.RateLimitError) as info:
            c.chat.completions.create(model="endless", messages=MESSAGES, max_tokens=1)  # type: ignore[arg-type]
        assert info.value.response.headers["retry-after"].isdigit()
        assert error_of(info.value.response)["type"] == "rate_limit_error"
        stream.close()
        assert CLOSED.acquire(timeout=WAIT_S)
        r = c.chat.completions.create(model="endless", messages=MESSAGES, max_tokens=2)  # type: ignore[arg-type]
        assert r.choices[0].message.content == "x x "


def test_deadline_is_504(strict_server: ServerThread) -> None:
    with strict_server.client() as c:
        with pytest.raises(openai.InternalServerError) as info:
            c.chat.completions.create(model="stall", messages=MESSAGES)  # type: ignore[arg-type]
        assert info.value.status_code == 504
        assert error_of(info.value.response)["code"] == "deadline_exceeded"
        # Before the first token, a stream still gets a real status, not a 200.
        with pytest.raises(openai.InternalServerError) as info:
            c.chat.completions.create(model="stall", messages=MESSAGES, stream=True)  # type: ignore[arg-type]
        assert info.value.status_code == 504
        assert strict_server.in_flight("stall") == 0


def test_oversize_body_is_413(strict_server: ServerThread) -> None:
    big = "word " * 20_000  # 100 kB > the strict server's 64 KiB
    with strict_server.client() as c:
        with pytest.raises(openai.APIStatusError) as info:
            c.chat.completions.create(model="echo", messages=[{"role": "user", "content": big}])
        assert info.value.status_code == 413
        # (the http layer's ProtocolError says code "bad_request" for its 413)
        assert error_of(info.value.response)["type"] == "invalid_request_error"
        ok = c.chat.completions.create(model="echo", messages=MESSAGES, max_tokens=1)  # type: ignore[arg-type]
        assert ok.choices[0].finish_reason == "length"


def test_error_mid_stream_is_a_final_sse_event(server: ServerThread, client: openai.OpenAI) -> None:
    body = {"model": "failing", "messages": MESSAGES, "stream": True}
    with httpx.stream("POST", server.url + CHAT, json=body) as r:
        assert r.status_code == 200
        raw = r.read()
    events = raw.split(b"\n\n")
    assert events[-1] == b""
    last = events[-2]
    assert last.startswith(b'data: {"error":')
    assert b"[DONE]" not in raw
    with pytest.raises(openai.APIError):
        for _ in client.chat.completions.create(model="failing", messages=MESSAGES, stream=True):  # type: ignore[arg-type]
            pass
