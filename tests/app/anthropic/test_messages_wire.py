"""The Messages API on the wire: the exact event sequence of a stream as bytes, the
errors in Anthropic's shape (those answered at the request head too), keys sent as
``x-api-key``, and nothing held after a client leaves mid-stream."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import anthropic
import httpx
import msgspec
import pytest

from tests.app.anthropic.messages_suite import KEY, SMALL_BODY_BYTES, client
from tests.support import ServerProcess, ServerThread, model_scaled, scaled, wait_until
from tests.support.models.streams import CLOSED

# Its smollm2 cases wait on the niced decode: pytest-timeout by model_slowdown
# (tests/conftest.py; decision 0055).
pytestmark = pytest.mark.niced

# A stream whose client left is released within this long (it is a bug, not a slow box,
# past it).
RELEASE_TIMEOUT_S = scaled(30.0)
HEADERS = {"anthropic-version": "2023-06-01"}
# httpx's 5 s default is too short for the engine on a busy 2-core box (a bound, not a
# timing assertion): scaled for smollm2's niced decode.
READ_TIMEOUT_S = model_scaled(60.0)
USER: Any = [{"role": "user", "content": "a b c"}]
WEATHER: Any = {
    "name": "get_weather",
    "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}},
}


def _events(lines: Iterator[str]) -> Iterator[tuple[str, dict[str, Any]]]:
    """``(event, data)`` pairs of an SSE body, each event checked to be one ``event:``
    line, one ``data:`` line and a blank line."""
    it = iter(lines)
    for line in it:
        if not line:
            continue
        assert line.startswith("event: "), line
        data = next(it)
        assert data.startswith("data: "), data
        assert next(it) == ""
        yield line[len("event: ") :], msgspec.json.decode(data[len("data: ") :])


def _stream(url: str, body: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    with httpx.stream(
        "POST", url + "/v1/messages", json=body, headers=HEADERS, timeout=READ_TIMEOUT_S
    ) as r:
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("text/event-stream")
        return list(_events(r.iter_lines()))


def _kinds(events: list[tuple[str, dict[str, Any]]]) -> list[str]:
    for name, data in events:
        assert data["type"] == name  # the event line names the data's type
    return [name for name, _ in events]


def test_a_text_stream_is_anthropics_exact_sequence(local: ServerThread) -> None:
    body = {"model": "echo", "max_tokens": 3, "messages": USER, "stream": True}
    events = _stream(local.url, body)
    kinds = _kinds(events)
    assert kinds == [
        "message_start",
        "content_block_start",
        "ping",
        "content_block_delta",
        "content_block_delta",
        "content_block_delta",
        "content_block_stop",
        "message_delta",
        "message_stop",
    ]
    start = events[0][1]["message"]
    assert start["content"] == [] and start["stop_reason"] is None
    assert start["role"] == "assistant" and start["model"] == "echo"
    assert events[1][1] == {
        "type": "content_block_start",
        "index": 0,
        "content_block": {"type": "text", "text": ""},
    }
    deltas = [d["delta"] for k, d in events if k == "content_block_delta"]
    assert all(d["type"] == "text_delta" for d in deltas)
    assert all(d["index"] == 0 for k, d in events if k.startswith("content_block"))
    end = events[-2][1]
    assert end["delta"] == {"stop_reason": "max_tokens", "stop_sequence": None}
    assert end["usage"]["output_tokens"] == 3
    assert end["usage"]["input_tokens"] == start["usage"]["input_tokens"] > 0


def test_a_tool_call_streams_its_input_as_json_deltas(local: ServerThread) -> None:
    body = {
        "model": "smollm2",
        "max_tokens": 48,
        "messages": [{"role": "user", "content": "Weather in Rome?"}],
        "tools": [WEATHER],
        "tool_choice": {"type": "tool", "name": "get_weather"},
        "temperature": 0,
        "stream": True,
    }
    events = _stream(local.url, body)
    kinds = _kinds(events)
    assert kinds[:3] == ["message_start", "content_block_start", "ping"]
    assert kinds[-3:] == ["content_block_stop", "message_delta", "message_stop"], events[-1]
    block = events[1][1]["content_block"]
    assert block["type"] == "tool_use" and block["name"] == "get_weather"
    assert block["input"] == {} and block["id"]
    deltas = [d["delta"] for k, d in events if k == "content_block_delta"]
    assert deltas and all(d["type"] == "input_json_delta" for d in deltas)
    assert isinstance(msgspec.json.decode("".join(d["partial_json"] for d in deltas)), dict)
    assert events[-2][1]["delta"]["stop_reason"] == "tool_use"


def test_a_failure_after_the_head_is_an_error_event(local: ServerThread) -> None:
    body = {"model": "failing", "max_tokens": 8, "messages": USER, "stream": True}
    events = _stream(local.url, body)
    assert _kinds(events)[-1] == "error"
    assert events[-1][1]["error"]["type"] == "api_error"
    assert "message_stop" not in _kinds(events)
    c = client(local.url)
    with (  # the SDK raises it, too
        pytest.raises(anthropic.APIStatusError),
        c.messages.stream(model="failing", max_tokens=8, messages=USER) as stream,
    ):
        for _ in stream:
            pass


def _error(r: httpx.Response, status: int, kind: str) -> str:
    assert r.status_code == status, r.text
    body = r.json()
    assert body["type"] == "error" and body["error"]["type"] == kind
    message: str = body["error"]["message"]
    return message


@pytest.mark.parametrize(
    ("change", "named"),
    [
        ({"max_tokens": None}, "max_tokens"),
        ({"messages": [{"role": "system", "content": "x"}]}, "messages[0].role"),
        ({"frequency_penalty": 1}, "frequency_penalty"),
        (
            {
                "messages": [
                    {
                        "role": "user",
                        "content": [
                            {"type": "text", "text": "what is this?"},
                            {
                                "type": "image",
                                "source": {
                                    "type": "base64",
                                    "media_type": "image/png",
                                    "data": "iVBORw0KGgo=",
                                },
                            },
                        ],
                    }
                ]
            },
            "messages[0].content[1]",
        ),
        ({"thinking": {"type": "enabled", "budget_tokens": 1024}}, "thinking"),
        ({"tools": [{"type": "web_search_20250305", "name": "web_search"}]}, "tools[0].type"),
        ({"tool_choice": {"type": "any"}}, "tool_choice"),
        ({"stop_sequences": ["a", "b", "c", "d", "e"]}, "stop_sequences"),
        ({"temperature": 1.5}, "temperature"),
    ],
    ids=[
        "missing-max_tokens",
        "bad-role",
        "unknown-field",
        "image",
        "thinking",
        "server-tool",
        "choice-without-tools",
        "too-many-stops",
        "temperature-range",
    ],
)
def test_bad_requests_are_400s_naming_the_field(
    local: ServerThread, change: dict[str, Any], named: str
) -> None:
    body: dict[str, Any] = {"model": "echo", "max_tokens": 4, "messages": USER, **change}
    body = {k: v for k, v in body.items() if v is not None}
    r = httpx.post(local.url + "/v1/messages", json=body, headers=HEADERS)
    message = _error(r, 400, "invalid_request_error")
    assert named in message


def test_the_sdk_raises_its_own_errors(local: ServerThread) -> None:
    c = client(local.url)
    with pytest.raises(anthropic.NotFoundError) as info:
        c.messages.create(model="no-such-model", max_tokens=4, messages=USER)
    assert info.value.body["error"]["type"] == "not_found_error"  # type: ignore[index]
    with pytest.raises(anthropic.BadRequestError):
        c.messages.count_tokens(model="echo", messages=[])
    # A busy model (queue depth 1, held by an open stream): 429 rate_limit_error.
    with c.messages.stream(model="endless", max_tokens=100_000, messages=USER) as held:
        next(iter(held))
        with pytest.raises(anthropic.RateLimitError) as busy:
            c.messages.create(model="endless", max_tokens=4, messages=USER)
        assert busy.value.body["error"]["type"] == "rate_limit_error"  # type: ignore[index]
        assert busy.value.response.headers["retry-after"]


def test_count_tokens_takes_a_ticket_like_any_request_to_the_model(local: ServerThread) -> None:
    """A count is admitted as the model's other requests are: past the queue bound it
    gets the busy model's 429 in Anthropic's shape, and it leaves no ticket behind."""
    c = client(local.url)
    counted = c.messages.count_tokens(model="endless", messages=USER).input_tokens
    assert counted > 0
    _released(local, "endless")
    with c.messages.stream(model="endless", max_tokens=100_000, messages=USER) as held:
        next(iter(held))
        with pytest.raises(anthropic.RateLimitError) as busy:
            c.messages.count_tokens(model="endless", messages=USER)
        assert busy.value.body["type"] == "error"  # type: ignore[index]
        assert busy.value.body["error"]["type"] == "rate_limit_error"  # type: ignore[index]
        assert busy.value.response.headers["retry-after"]
    _released(local, "endless")
    assert c.messages.count_tokens(model="endless", messages=USER).input_tokens == counted


def test_errors_before_routing_are_in_anthropics_shape(keyed: ServerProcess) -> None:
    url = keyed.url + "/v1/messages"
    body: Any = {"model": "echo", "max_tokens": 4, "messages": USER}
    _error(httpx.post(url, json=body), 401, "authentication_error")
    _error(httpx.post(url, json=body, headers={"x-api-key": "wrong"}), 401, "authentication_error")
    big = {**body, "system": "x" * SMALL_BODY_BYTES}
    _error(httpx.post(url, json=big, headers={"x-api-key": KEY}), 413, "request_too_large")
    _error(httpx.post(url + "/nope", json=body, headers={"x-api-key": KEY}), 404, "not_found_error")
    _error(httpx.get(url, headers={"x-api-key": KEY}), 405, "invalid_request_error")
    # The SDK sends its key as x-api-key, with anthropic-version: both accepted.
    m = client(keyed.url, api_key=KEY).messages.create(model="echo", max_tokens=2, messages=USER)
    assert m.usage.output_tokens == 2
    with pytest.raises(anthropic.AuthenticationError):
        client(keyed.url, api_key="wrong").messages.create(
            model="echo", max_tokens=2, messages=USER
        )


def _released(local: ServerThread, model: str) -> None:
    wait_until(
        lambda: not local.in_flight(model), 30.0, f"{model} to release its ticket", model=True
    )


@pytest.mark.parametrize("model", ["endless", "smollm2"])
def test_leaving_mid_stream_releases_everything(local: ServerThread, model: str) -> None:
    body = {"model": model, "max_tokens": 400, "messages": USER, "stream": True}
    with httpx.stream(
        "POST", local.url + "/v1/messages", json=body, headers=HEADERS, timeout=READ_TIMEOUT_S
    ) as r:
        events = _events(r.iter_lines())
        kinds = [next(events)[0] for _ in range(5)]
        assert kinds[:3] == ["message_start", "content_block_start", "ping"]
    if model == "endless":
        assert CLOSED.acquire(timeout=RELEASE_TIMEOUT_S)  # the generator was closed
    _released(local, model)
    # The model serves the next request.
    m = client(local.url).messages.create(model=model, max_tokens=2, messages=USER)
    assert m.usage.output_tokens == 2


def test_fields_that_change_nothing_are_accepted(local: ServerThread) -> None:
    """``metadata.user_id``, ``cache_control`` (the engine caches prompts anyway),
    ``thinking`` disabled and any ``anthropic-version``; ``metadata``'s other keys are
    refused by name."""
    block = {"type": "text", "text": "a b c", "cache_control": {"type": "ephemeral"}}
    body: dict[str, Any] = {
        "model": "echo",
        "max_tokens": 2,
        "system": [{"type": "text", "text": "s", "cache_control": {"type": "ephemeral"}}],
        "messages": [{"role": "user", "content": [block]}],
        "metadata": {"user_id": "u-1"},
        "thinking": {"type": "disabled"},
    }
    r = httpx.post(local.url + "/v1/messages", json=body, headers={"anthropic-version": "1999"})
    assert r.status_code == 200, r.text
    assert r.json()["usage"]["output_tokens"] == 2
    bad = {**body, "metadata": {"user_id": "u-1", "tier": "x"}}
    r = httpx.post(local.url + "/v1/messages", json=bad)
    assert "metadata.tier" in _error(r, 400, "invalid_request_error")


def test_the_api_document_describes_the_routes(local: ServerThread) -> None:
    doc = httpx.get(local.url + "/openapi.json").json()
    for path in ("/v1/messages", "/v1/messages/count_tokens"):
        op = doc["paths"][path]["post"]
        assert op["responses"]["4XX"]["content"]["application/json"]["schema"] == {
            "$ref": "#/components/schemas/AnthropicError"
        }
    schemas = doc["components"]["schemas"]
    assert "max_tokens" in schemas["MessagesRequest"]["required"]
    events = doc["paths"]["/v1/messages"]["post"]["responses"]["200"]["content"]
    assert "text/event-stream" in events
