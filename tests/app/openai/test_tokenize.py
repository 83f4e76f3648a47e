"""``POST /tokenize`` and ``POST /detokenize`` (docs/extensions.md) in vLLM's shape and
llama.cpp's, against a real server: ``smollm2`` (llama.cpp's tokenizer and chat template,
through the engine's side port), ``tinyllm`` and ``minilm`` (their ``tokenizers``
tokenizers), and ``echo``, which has none (a 400 naming ``model``).

A conversation's count is checked against what the model's own chat completion reports
as its ``usage.prompt_tokens``: the same template, the same tokenizer.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.support import ServerProcess, model_scaled, start_server

pytest.importorskip("xllamacpp")

# Its smollm2 cases wait on the niced decode: pytest-timeout by model_slowdown
# (tests/conftest.py; docs/decisions/0055-model-waits-scaled-for-the-niced-share.md).
pytestmark = pytest.mark.niced

MESSAGES = [{"role": "user", "content": "What is the capital of France?"}]
TEXT = "Hello world, héllo wörld! 你好"


@pytest.fixture(scope="module")
def srv() -> Iterator[ServerProcess]:
    server = start_server(
        "--model", "smollm2?parallel=1&n_ctx=1024", "--model", "tinyllm",
        "--model", "minilm", "--model", "echo",
    )  # fmt: skip
    yield server
    assert server.stop() == 0


def _post(srv: ServerProcess, path: str, body: dict[str, Any]) -> httpx.Response:
    return httpx.post(srv.url + path, json=body, timeout=model_scaled(60))


def _cards(srv: ServerProcess) -> dict[str, Any]:
    return {c["id"]: c["capabilities"] for c in httpx.get(srv.url + "/v1/models").json()["data"]}


@pytest.mark.parametrize("model", ["smollm2", "tinyllm", "minilm"])
def test_a_prompt_round_trips(srv: ServerProcess, model: str) -> None:
    r = _post(srv, "/tokenize", {"model": model, "prompt": TEXT, "add_special_tokens": False})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["count"] == len(body["tokens"]) > 0
    assert body["max_model_len"] == _cards(srv)[model]["context_length"]
    assert body["token_strs"] is None
    back = _post(srv, "/detokenize", {"model": model, "tokens": body["tokens"]})
    assert back.status_code == 200, back.text
    text = back.json()["prompt"]
    assert back.json()["content"] == text
    # MiniLM's WordPiece lowercases and strips accents; the BPE models give the text back.
    assert text == TEXT if model != "minilm" else text.startswith("hello world")


@pytest.mark.parametrize("model", ["smollm2", "tinyllm"])
def test_a_conversation_counts_as_the_model_reads_it(srv: ServerProcess, model: str) -> None:
    r = _post(srv, "/tokenize", {"model": model, "messages": MESSAGES})
    assert r.status_code == 200, r.text
    answer = _post(
        srv, "/v1/chat/completions", {"model": model, "messages": MESSAGES, "max_tokens": 1}
    )
    assert answer.status_code == 200, answer.text
    assert r.json()["count"] == answer.json()["usage"]["prompt_tokens"]


WEATHER: Any = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    },
}


@pytest.mark.parametrize(
    "choice", [None, "auto", "required", {"type": "function", "function": {"name": "get_weather"}}]
)
def test_a_conversation_with_tools_counts_the_tools_prompt(srv: ServerProcess, choice: Any) -> None:
    """smollm2's template knows no tools: they reach its prompt as a system turn (a forced
    call's, or the generic format's), and the count is of the request the engine runs."""
    tools: dict[str, Any] = {"tools": [WEATHER]}
    if choice is not None:
        tools["tool_choice"] = choice
    bare = _post(srv, "/tokenize", {"model": "smollm2", "messages": MESSAGES})
    r = _post(srv, "/tokenize", {"model": "smollm2", "messages": MESSAGES, **tools})
    assert r.status_code == 200, r.text
    assert r.json()["count"] > bare.json()["count"]
    chat = {"model": "smollm2", "messages": MESSAGES, "max_tokens": 1, **tools}
    answer = _post(srv, "/v1/chat/completions", chat)
    assert answer.status_code == 200, answer.text
    assert r.json()["count"] == answer.json()["usage"]["prompt_tokens"]


def test_special_tokens_as_vllm_and_llamacpp_default_them(srv: ServerProcess) -> None:
    """tinyllm puts <|endoftext|> (id 0) before a prompt it reads: vLLM's ``prompt``
    adds it by default, llama.cpp's ``content`` does not, and both take the flag."""

    def tokens(**body: Any) -> list[int]:
        r = _post(srv, "/tokenize", {"model": "tinyllm", **body})
        assert r.status_code == 200, r.text
        out: list[int] = r.json()["tokens"]
        return out

    plain = tokens(content="str.split")
    assert tokens(prompt="str.split") == [0, *plain]
    assert tokens(prompt="str.split", add_special_tokens=False) == plain
    assert tokens(content="str.split", add_special=True) == [0, *plain]


def test_minilm_wraps_a_text_in_cls_and_sep(srv: ServerProcess) -> None:
    r = _post(srv, "/tokenize", {"model": "minilm", "prompt": "hello"})
    assert r.json()["tokens"] == [101, 7592, 102]  # [CLS] hello [SEP]


@pytest.mark.parametrize(
    ("path", "body", "status", "param"),
    [
        ("/tokenize", {"model": "echo", "prompt": "x"}, 400, "model"),
        ("/detokenize", {"model": "echo", "tokens": [1]}, 400, "model"),
        ("/tokenize", {"model": "minilm", "messages": MESSAGES}, 400, "messages"),
        ("/tokenize", {"model": "nope", "prompt": "x"}, 404, "model"),
        ("/tokenize", {"model": "tinyllm"}, 400, "prompt"),
        ("/tokenize", {"model": "tinyllm", "prompt": "x", "messages": MESSAGES}, 400, "messages"),
        ("/tokenize", {"model": "tinyllm", "prompt": "x", "add_special": True,
                       "add_special_tokens": True}, 400, "add_special"),
        ("/tokenize", {"model": "tinyllm", "prompt": None}, 400, "prompt"),
        ("/tokenize", {"model": "tinyllm", "prompt": "x", "with_pieces": True}, 400,
         "with_pieces"),
        ("/tokenize", {"model": "tinyllm", "prompt": "x", "return_token_strs": True}, 400,
         "return_token_strs"),
        ("/tokenize", {"model": "tinyllm", "messages": MESSAGES,
                       "add_generation_prompt": False}, 400, "add_generation_prompt"),
        ("/tokenize", {"model": "tinyllm", "prompt": "x", "chat_template": "y"}, 400,
         "chat_template"),
        ("/tokenize", {"model": "tinyllm", "prompt": "x" * (512 * 1024 + 1)}, 400, "prompt"),
        ("/tokenize", {"model": "smollm2", "prompt": "x", "tools": [WEATHER]}, 400, "tools"),
        ("/tokenize", {"model": "smollm2", "messages": MESSAGES, "tools": []}, 400, "tools"),
        ("/tokenize", {"model": "smollm2", "messages": MESSAGES, "tool_choice": "required"},
         400, "tool_choice"),
        ("/tokenize", {"model": "tinyllm", "messages": MESSAGES, "tools": [WEATHER]}, 400,
         "tools"),
        ("/detokenize", {"model": "smollm2", "tokens": [49152]}, 400, "tokens"),
        ("/detokenize", {"model": "tinyllm", "tokens": [1 << 20]}, 400, "tokens"),
        ("/detokenize", {"model": "minilm", "tokens": [-1]}, 400, "tokens[0]"),
        ("/detokenize", {"model": "minilm", "tokens": [0] * ((1 << 16) + 1)}, 400, "tokens"),
    ],
)  # fmt: skip
def test_what_cannot_be_served_is_refused_naming_it(
    srv: ServerProcess, path: str, body: dict[str, Any], status: int, param: str
) -> None:
    r = _post(srv, path, body)
    assert r.status_code == status, r.text
    error = r.json()["error"]
    assert error["param"] == param
    assert "xxxxxxxx" not in r.text  # the input is not echoed


def test_the_card_and_the_document_say_it(srv: ServerProcess) -> None:
    cards = _cards(srv)
    assert {m: cards[m]["tokenizer"] for m in cards} == {
        "smollm2": True,
        "tinyllm": True,
        "minilm": True,
        "echo": False,
    }
    paths = httpx.get(srv.url + "/openapi.json").json()["paths"]
    assert {"/tokenize", "/detokenize"} <= set(paths)
