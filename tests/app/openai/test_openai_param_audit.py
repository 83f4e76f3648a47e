"""The silent-drop audit: every parameter of the official SDK's chat and completion
requests is either honoured or refused with a 400 naming it, on every backend.

The parameter lists come from the installed ``openai`` SDK itself, so a parameter that a
new SDK adds fails this test until it is classified here. Each parameter is sent with a
value that would change the answer (or, for the metadata ones, any value), alone on a
tiny request; the answer must be a 200 where the backend honours it and a 400 naming it
where it does not. ``tinyllm`` and ``echo`` take the generic path that every
``Model.generate`` backend shares (the transformers backend and user models too);
``smollm2`` is served by llama.cpp's engine.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from openai.types import completion_create_params as completion_params
from openai.types.chat import completion_create_params as chat_params

from tests.support import ServerProcess, model_scaled, start_server
from tests.support.smollm2 import require_llamacpp, smollm2_arg

require_llamacpp()

# Its smollm2 cases wait on the niced decode: pytest-timeout by model_slowdown
# (tests/conftest.py; docs/decisions/0055-model-waits-scaled-for-the-niced-share.md).
pytestmark = pytest.mark.niced

BACKENDS = ("echo", "tinyllm", "smollm2")
ALL = set(BACKENDS)
GENERIC = {"echo", "tinyllm"}
ENGINE = {"smollm2"}
NONE: set[str] = set()
TOOL = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}

# parameter -> (a value that matters, the backends that honour or harmlessly accept it)
CHAT: dict[str, tuple[Any, set[str]]] = {
    "audio": ({"voice": "alloy", "format": "wav"}, NONE),
    "frequency_penalty": (0.5, ENGINE),
    "function_call": ("auto", NONE),
    "functions": ([TOOL["function"]], NONE),
    "logit_bias": ({"60": -100}, ENGINE),
    "logprobs": (True, ENGINE),
    "max_completion_tokens": (1, ALL),
    "max_tokens": (1, ALL),
    "metadata": ({"k": "v"}, ALL),
    "modalities": (["text", "audio"], NONE),
    "moderation": ("auto", NONE),
    "n": (2, ALL),
    "parallel_tool_calls": (False, ALL),
    "prediction": ({"type": "content", "content": "x"}, NONE),
    "presence_penalty": (0.5, ENGINE),
    "prompt_cache_key": ("k", ALL),
    "prompt_cache_options": ({}, ALL),
    "prompt_cache_retention": ("24h", ALL),
    "reasoning_effort": ("low", NONE),
    "response_format": ({"type": "json_object"}, ENGINE),
    "safety_identifier": ("s", ALL),
    "seed": (1, ALL),
    "service_tier": ("auto", ALL),
    "stop": (["x"], ALL),
    "store": (False, ALL),
    "stream_options": ({"include_usage": True}, ALL),
    "temperature": (0.5, ALL),
    "tool_choice": ("required", NONE),  # without tools: refused everywhere, as by OpenAI
    "tools": ([TOOL], ENGINE),
    "top_logprobs": (2, NONE),  # without logprobs: refused everywhere, as by OpenAI
    "top_p": (0.5, ALL),
    "user": ("u", ALL),
    "verbosity": ("low", NONE),
    "web_search_options": ({}, NONE),
}
COMPLETION: dict[str, tuple[Any, set[str]]] = {
    "best_of": (2, NONE),
    "echo": (True, NONE),
    "frequency_penalty": (0.5, ENGINE),
    "logit_bias": ({"60": -100}, ENGINE),
    "logprobs": (1, ENGINE),
    "max_tokens": (1, ALL),
    "n": (2, ALL),
    "presence_penalty": (0.5, ENGINE),
    "seed": (1, ALL),
    "stop": (["x"], ALL),
    "stream_options": ({"include_usage": True}, ALL),
    "suffix": ("x", NONE),
    "temperature": (0.5, ALL),
    "top_p": (0.5, ALL),
    "user": ("u", ALL),
}
REQUIRED_CHAT = {"messages", "model"}
REQUIRED_COMPLETION = {"prompt", "model"}


@pytest.fixture(scope="module")
def audit_server() -> Iterator[ServerProcess]:
    server = start_server("--model", "echo", "--model", "tinyllm", "--model", smollm2_arg())
    yield server
    assert server.stop() == 0


def test_every_sdk_parameter_is_classified() -> None:
    assert set(chat_params.CompletionCreateParamsBase.__annotations__) - REQUIRED_CHAT == set(CHAT)
    sdk = set(completion_params.CompletionCreateParamsBase.__annotations__)
    assert sdk - REQUIRED_COMPLETION == set(COMPLETION)


def _check(url: str, body: dict[str, Any], name: str, honoured: bool) -> None:
    r = httpx.post(url, json=body, timeout=model_scaled(60))
    if honoured:
        assert r.status_code == 200, (name, r.text)
        return
    assert r.status_code == 400, (name, r.status_code, r.text)
    param = r.json()["error"]["param"] or ""
    assert param == name or param.startswith((name + "[", name + ".")), (name, param)


@pytest.mark.parametrize("backend", BACKENDS)
def test_chat_parameters_are_honoured_or_refused(audit_server: ServerProcess, backend: str) -> None:
    for name, (value, honoured_by) in CHAT.items():
        body = {
            "model": backend,
            "messages": [{"role": "user", "content": "hi"}],
            "max_tokens": 1,
            name: value,
        }
        _check(audit_server.url + "/v1/chat/completions", body, name, backend in honoured_by)


@pytest.mark.parametrize("backend", BACKENDS)
def test_completion_parameters_are_honoured_or_refused(
    audit_server: ServerProcess, backend: str
) -> None:
    for name, (value, honoured_by) in COMPLETION.items():
        body = {"model": backend, "prompt": "hi", "max_tokens": 1, name: value}
        _check(audit_server.url + "/v1/completions", body, name, backend in honoured_by)


def test_unknown_fields_are_refused_by_name(audit_server: ServerProcess) -> None:
    for backend in BACKENDS:
        body = {"model": backend, "messages": [{"role": "user", "content": "hi"}], "zzz": 1}
        _check(audit_server.url + "/v1/chat/completions", body, "zzz", False)


@pytest.mark.parametrize("backend", BACKENDS)
def test_allowed_tools_are_honoured_or_refused(audit_server: ServerProcess, backend: str) -> None:
    """``tool_choice`` of type ``allowed_tools``: honoured by the engine; the generic path
    refuses the tools it comes with (or, alone, the choice itself), never drops it."""
    allowed = {"mode": "required", "tools": [{"type": "function", "function": {"name": "f"}}]}
    body = {
        "model": backend,
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": 8,
        "tool_choice": {"type": "allowed_tools", "allowed_tools": allowed},
    }
    url = audit_server.url + "/v1/chat/completions"
    _check(url, {**body, "tools": [TOOL]}, "tools", backend in ENGINE)
    _check(url, body, "tool_choice", False)  # without tools: refused everywhere
