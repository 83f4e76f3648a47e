"""``GET /openapi.json``: generated from the msgspec schemas, valid OpenAPI 3.1, and it
describes every route the server answers."""

from __future__ import annotations

import httpx
from openapi_spec_validator import validate

from tests.support import ServerProcess


def test_openapi_document_is_valid_and_complete(echo_server: ServerProcess) -> None:
    r = httpx.get(echo_server.url + "/openapi.json")
    assert r.status_code == 200 and r.headers["content-type"] == "application/json"
    doc = r.json()
    validate(doc)  # raises on an invalid OpenAPI document
    paths = doc["paths"]
    for path, method in [
        ("/health", "get"),
        ("/ready", "get"),
        ("/metrics", "get"),
        ("/v1/models", "get"),
        ("/v1/models/{model}", "get"),
        ("/v1/chat/completions", "post"),
        ("/v1/completions", "post"),
        ("/v1/embeddings", "post"),
        ("/v1/responses", "post"),
        ("/v1/raw/{model}", "post"),
        ("/v2/models/{model}/infer", "post"),
        ("/v2/models/{model}/versions/{version}/infer", "post"),
        ("/openapi.json", "get"),
    ]:
        assert method in paths[path], (path, method)
    chat = paths["/v1/chat/completions"]["post"]
    ref = chat["requestBody"]["content"]["application/json"]["schema"]["$ref"]
    request = doc["components"]["schemas"][ref.rsplit("/", 1)[1]]
    for field in ("messages", "tools", "tool_choice", "response_format", "logprobs", "n"):
        assert field in request["properties"]
    assert "text/event-stream" in chat["responses"]["200"]["content"]
    responses = paths["/v1/responses"]["post"]
    ref = responses["requestBody"]["content"]["application/json"]["schema"]["$ref"]
    request = doc["components"]["schemas"][ref.rsplit("/", 1)[1]]
    for field in ("input", "instructions", "max_output_tokens", "text", "previous_response_id"):
        assert field in request["properties"]
    answer = responses["responses"]["200"]["content"]
    ref = answer["application/json"]["schema"]["$ref"]
    assert "output" in doc["components"]["schemas"][ref.rsplit("/", 1)[1]]["properties"]
    events = answer["text/event-stream"]["x-event-data"]["anyOf"]
    names = {e["$ref"].rsplit("/", 1)[1] for e in events}
    assert {"TextDeltaEvent", "LifecycleEvent", "ErrorEvent"} <= names
    infer = paths["/v2/models/{model}/infer"]["post"]
    err = infer["responses"]["4XX"]["content"]["application/json"]["schema"]["$ref"]
    assert err.endswith("/KServeError")


def test_generation_metrics_for_a_generic_model(echo_server: ServerProcess) -> None:
    """Every generative model exports TTFT, inter-token times and tokens (not only the
    engine-backed ones): echo streams its prompt back token by token."""
    body = {"model": "echo", "messages": [{"role": "user", "content": "a b c d"}], "stream": True}
    r = httpx.post(echo_server.url + "/v1/chat/completions", json=body)
    assert r.status_code == 200
    text = httpx.get(echo_server.url + "/metrics").text
    for name in (
        "zeroserve_generation_ttft_seconds_count",
        "zeroserve_generation_tokens_total",
        "zeroserve_generation_inter_token_seconds_count",
    ):
        line = next(ln for ln in text.splitlines() if ln.startswith(name + '{model="echo"}'))
        assert float(line.split()[-1]) > 0, line
