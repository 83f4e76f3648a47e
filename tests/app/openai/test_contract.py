"""The contract holds: requests generated from the server's own ``/openapi.json`` (by
Schemathesis, on Hypothesis) against every backend kind, checking that

* no request gets a 5xx,
* every request the document calls valid is answered 2xx, and its answer matches the
  document (a stream: every event is JSON and none is an error),
* every request the document calls invalid is refused with a 4xx in the API's error shape.

One server holds a model of each local kind (``echo``: a generic ``Model``; ``tinyllm``:
a step-batched generator; ``minilm``: an embedder; ``smollm2``: llama.cpp's engine) and a
second serves ``gw``, a ``remote:`` model relaying to the first's ``smollm2``. Each
(route, model) pair gets its own document: ``model`` fixed to the model, and what the model
tells a client in ``/v1/models`` applied the way a client would apply it (a parameter
outside ``capabilities.parameters`` is not sent; a model without tools gets no tool turns
in its history, and a model whose ``input_modalities`` lack ``image`` no image parts).
So a client that reads the document and the model's card is never
refused for the shape of its request.

What the document cannot say, and the test therefore does not generate, is stated in the
document's descriptions: integers are written as integers (``3``, not ``3.0``); tool names
are unique and a tool choice names one of them; a model's chat template may refuse a
conversation's shape (a 400 naming ``messages``, accepted below for the llama.cpp models
only). Sizes are capped so a prompt fits the smallest context here (512 tokens); the
server's own limits are tested at their bounds elsewhere (``test_openai_errors.py``).

The run is bounded: ``ZEROSERVE_CONTRACT_EXAMPLES`` examples per (route, model, mode),
10 by default, drawn the same way every run (``ZEROSERVE_CONTRACT_FRESH=1`` draws anew).
"""

from __future__ import annotations

import copy
import json
import os
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, Phase, given, settings

from tests.support import ServerProcess, model_scaled, start_server
from tests.support.smollm2 import require_llamacpp, smollm2_arg
from zeroserve.app.chat.request import OPTIONAL_PARAMETERS

schemathesis = pytest.importorskip("schemathesis")
require_llamacpp()

# Its smollm2 cases wait on the niced decode: pytest-timeout by model_slowdown
# (tests/conftest.py; docs/decisions/0055-model-waits-scaled-for-the-niced-share.md).
pytestmark = pytest.mark.niced

from schemathesis import checks  # noqa: E402
from schemathesis.generation import GenerationMode  # noqa: E402

EXAMPLES = int(os.environ.get("ZEROSERVE_CONTRACT_EXAMPLES", "10"))
# A fixed draw by default, so a run of the suite repeats the last one; set
# ZEROSERVE_CONTRACT_FRESH=1 to explore new requests (the way the findings above were made).
FRESH = os.environ.get("ZEROSERVE_CONTRACT_FRESH") == "1"
# The llama.cpp models: their chat template may refuse a conversation's shape.
TEMPLATED = {"smollm2", "gw"}
# ``gw`` relays to the upstream's ``smollm2``: the upstream's card says what it honours.
UPSTREAM_OF = {"gw": "smollm2"}
CHAT_ROUTES = ("/v1/chat/completions", "/v1/completions", "/v1/responses")
CASES = [
    *((route, model) for route in CHAT_ROUTES for model in ("echo", "tinyllm", "smollm2", "gw")),
    *(("/v1/embeddings", model) for model in ("echo", "minilm")),
]
# A fixed, bounded draw per case (see the module's docstring).
DRAW = settings(
    max_examples=EXAMPLES,
    deadline=None,
    database=None,
    derandomize=not FRESH,
    phases=[Phase.generate],
    suppress_health_check=list(HealthCheck),
)
# Small sizes: a generated conversation fits a 512-token context and answers in a few tokens.
MAX_STRING, MAX_ITEMS, MAX_PROPERTIES, MAX_OUTPUT = 12, 3, 3, 4


@pytest.fixture(scope="module")
def upstream() -> Iterator[ServerProcess]:
    server = start_server(
        "--model", "echo", "--model", "tinyllm", "--model", "minilm",
        "--model", smollm2_arg(),
    )  # fmt: skip
    yield server
    assert server.stop() == 0


@pytest.fixture(scope="module")
def gateway(upstream: ServerProcess) -> Iterator[ServerProcess]:
    server = start_server("--model", f"gw=remote:{upstream.url}/v1?upstream_model=smollm2")
    yield server
    assert server.stop() == 0


def _capped(node: Any) -> Any:
    """``node`` (a JSON Schema) with every string, array and free object kept small."""
    if isinstance(node, list):
        return [_capped(n) for n in node]
    if not isinstance(node, dict):
        return node
    out = {k: _capped(v) for k, v in node.items()}
    kind = out.get("type")
    if kind == "string" and "enum" not in out and "const" not in out:
        out["maxLength"] = min(out.get("maxLength", MAX_STRING), MAX_STRING)
    if kind == "array" or "items" in out:
        out["maxItems"] = min(out.get("maxItems", MAX_ITEMS), MAX_ITEMS)
    if kind == "object":
        out["maxProperties"] = min(out.get("maxProperties", MAX_PROPERTIES), MAX_PROPERTIES)
    return out


def _document_for(
    doc: dict[str, Any], route: str, model: str, card: dict[str, Any], *, narrow: bool
) -> Any:
    """The document as a client of ``model`` reads it, for ``route`` only; ``narrow``: as
    a client that follows the model's card and keeps its requests small (for valid
    requests; invalid ones are drawn from the whole document)."""
    d = copy.deepcopy(doc)
    d["paths"] = {route: d["paths"][route]}
    schemas = d["components"]["schemas"]
    body = d["paths"][route]["post"]["requestBody"]["content"]["application/json"]["schema"]
    request = schemas[body["$ref"].rsplit("/", 1)[1]]
    props = request["properties"]
    props["model"] = {"const": model}
    if not narrow:
        return schemathesis.openapi.from_dict(d)
    honoured = set(card["parameters"])
    for name in OPTIONAL_PARAMETERS:  # the optional parameters a card may leave out
        if name not in honoured:
            props.pop(name, None)
    if "tools" not in honoured:  # no tool turns in the history of a model without tools
        for turn in ("Message", "InputItem"):
            if turn in schemas:
                schemas[turn]["properties"].pop("tool_calls", None)
        if "InputItem" in schemas:
            schemas["InputItem"]["properties"]["type"] = {"const": "message"}
    if "image" not in card["input_modalities"]:  # no image parts for a model that reads none
        if "ContentPart" in schemas:
            schemas["ContentPart"]["properties"]["type"] = {"const": "text"}
        if "InputPart" in schemas:
            schemas["InputPart"]["properties"]["type"] = {"enum": ["input_text", "output_text"]}
    # Answers kept short: an unbounded one runs to the context's end (valid, but slow).
    for name in ("max_tokens", "max_completion_tokens", "max_output_tokens"):
        if name in props:
            props[name] = {"type": "integer", "minimum": 1, "maximum": MAX_OUTPUT}
    bound = "max_output_tokens" if "max_output_tokens" in props else "max_tokens"
    if bound in props:
        props.pop("max_completion_tokens", None)
        request["required"] = sorted({*request.get("required", []), bound})
    if route == "/v1/embeddings" and not card["token_inputs"]:  # text, as the card says
        props["input"] = {
            "anyOf": [
                {"type": "string"},
                {"type": "array", "items": {"type": "string"}, "minItems": 1},
            ]
        }
    if "dimensions" in props:  # the model's width, when its card tells it
        width = card["embedding_dimensions"]
        props["dimensions"] = {"enum": [width, None]} if width else {"type": "null"}
    if "n" in props:
        props["n"] = {"anyOf": [{"type": "integer", "minimum": 1, "maximum": 2}, {"type": "null"}]}
    answers = _reachable(schemas, d["paths"][route]["post"]["responses"])
    for name in _reachable(schemas, body) - answers:  # answers are checked as they are
        schemas[name] = _capped(schemas[name])
    return schemathesis.openapi.from_dict(d)


def _reachable(schemas: dict[str, Any], node: Any) -> set[str]:
    """The names of the component schemas ``node`` refers to, directly or not."""
    found: set[str] = set()
    todo = [node]
    while todo:
        n = todo.pop()
        if isinstance(n, list):
            todo.extend(n)
        elif isinstance(n, dict):
            ref = n.get("$ref")
            if isinstance(ref, str) and ref.startswith("#/components/schemas/"):
                name = ref.rsplit("/", 1)[1]
                if name not in found:
                    found.add(name)
                    todo.append(schemas[name])
            todo.extend(v for k, v in n.items() if k != "$ref")
    return found


def _integral(value: Any) -> Any:
    """``value`` with integral floats written as integers (the document's descriptions
    say integers are sent as integers; JSON Schema alone would allow ``3.0``)."""
    if isinstance(value, float) and value.is_integer() and abs(value) < 2**53:
        return int(value)
    if isinstance(value, list):
        return [_integral(v) for v in value]
    if isinstance(value, dict):
        return {k: _integral(v) for k, v in value.items()}
    return value


def _unexpressible(body: Any) -> bool:
    """Whether ``body`` breaks a rule the document states in words only: unique tool names,
    and a tool choice that names one of them."""
    if not isinstance(body, dict) or not isinstance(body.get("tools"), list):
        return False
    names = [
        (t.get("function") or {}).get("name", t.get("name")) if isinstance(t, dict) else None
        for t in body["tools"]
    ]
    if len({json.dumps(n) for n in names}) != len(names):
        return True
    choice = body.get("tool_choice")
    if isinstance(choice, dict):
        named = choice.get("name") or (choice.get("function") or {}).get("name")
        if named is not None and named not in names:
            return True
        allowed = choice.get("tools") or (choice.get("allowed_tools") or {}).get("tools")
        if isinstance(allowed, list):
            for t in allowed:
                name = t.get("name") or (t.get("function") or {}).get("name")
                if name not in names:
                    return True
    return False


def _template_refusal(model: str, response: httpx.Response) -> bool:
    """A 400 from a llama.cpp model's chat template refusing a conversation's shape."""
    if model not in TEMPLATED or response.status_code != 400:
        return False
    error = response.json()["error"]
    return error["param"] in ("messages", "input", "prompt") and (
        "template" in error["message"] or "engine refused" in error["message"]
    )


def _stream_events(response: httpx.Response) -> list[Any]:
    events = []
    for line in response.text.splitlines():
        if line.startswith("data: ") and line != "data: [DONE]":
            events.append(json.loads(line[6:]))
    return events


def _servers(upstream: ServerProcess, gateway: ServerProcess, model: str) -> tuple[str, Any]:
    url = gateway.url if model == "gw" else upstream.url
    cards = httpx.get(upstream.url + "/v1/models").json()["data"]
    card = next(c for c in cards if c["id"] == UPSTREAM_OF.get(model, model))
    return url, card["capabilities"]


@pytest.mark.slow
@pytest.mark.parametrize(("route", "model"), CASES)
def test_valid_requests_are_answered_as_documented(
    upstream: ServerProcess, gateway: ServerProcess, route: str, model: str
) -> None:
    url, card = _servers(upstream, gateway, model)
    doc = httpx.get(url + "/openapi.json").json()
    document = _document_for(doc, route, model, card, narrow=True)
    operation = next(iter(document.get_all_operations())).ok()

    with httpx.Client(base_url=url, timeout=model_scaled(60)) as client:

        @DRAW
        @given(operation.as_strategy(generation_mode=GenerationMode.POSITIVE))
        def run(case: Any) -> None:
            body = _integral(case.body)
            if _unexpressible(body):
                return
            response = client.post(route, json=body)
            if _template_refusal(model, response):
                return
            assert response.status_code == 200, (body, response.text)
            if response.headers["content-type"].startswith("text/event-stream"):
                events = _stream_events(response)
                assert events, response.text
                assert not any("error" in e and e.get("type") != "response.completed"
                               for e in events if isinstance(e, dict) and e.get("error")), events  # fmt: skip
                return
            case.body = body
            case.validate_response(
                response, checks=[checks.not_a_server_error, checks.response_schema_conformance]
            )

        run()


@pytest.mark.slow
@pytest.mark.parametrize(("route", "model"), CASES)
def test_invalid_requests_are_refused_in_the_error_shape(
    upstream: ServerProcess, gateway: ServerProcess, route: str, model: str
) -> None:
    url, card = _servers(upstream, gateway, model)
    doc = httpx.get(url + "/openapi.json").json()
    document = _document_for(doc, route, model, card, narrow=False)
    operation = next(iter(document.get_all_operations())).ok()

    @DRAW
    @given(operation.as_strategy(generation_mode=GenerationMode.NEGATIVE))
    def run(case: Any) -> None:
        response = case.call(base_url=url)
        case.validate_response(
            response,
            checks=[
                checks.not_a_server_error,
                checks.negative_data_rejection,
                checks.response_schema_conformance,
            ],
        )

    run()
