"""Hostile bodies for the llama.cpp engine's own decoders and relay (the built-in
``smollm2``: chat with tools, response_format and logprobs; completions; the Responses
API with function tools and the agent loop's items), through the
real server: always a 2xx or an OpenAI-format 4xx (a 504 when the model's own timeout
passed), never a 5xx, nothing left held (tickets, engine slots, leases)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings

from tests.fuzz import strategies as fs
from tests.fuzz.checks import assert_answer
from tests.fuzz.conftest import ENGINE_EXAMPLES, Target
from tests.support.smollm2 import require_llamacpp

require_llamacpp()

# Every example waits on smollm2's niced decode: pytest-timeout by model_slowdown
# (tests/conftest.py; docs/decisions/0055-model-waits-scaled-for-the-niced-share.md).
pytestmark = pytest.mark.niced


def _send(target: Target, path: str, body: bytes, timeouts: dict[str, str]) -> None:
    headers = {"content-type": "application/json", **timeouts}
    r = target.send("POST", path, body, headers=headers)
    assert_answer(target, r, "openai", timed=True)


@settings(max_examples=ENGINE_EXAMPLES)
@given(body=fs.engine_chat_bodies(), timeouts=fs.sdk_timeouts)
def test_engine_chat_bodies(engine_target: Target, body: bytes, timeouts: dict[str, str]) -> None:
    _send(engine_target, "/v1/chat/completions", body, timeouts)


@settings(max_examples=ENGINE_EXAMPLES)
@given(body=fs.engine_completion_bodies(), timeouts=fs.sdk_timeouts)
def test_engine_completion_bodies(
    engine_target: Target, body: bytes, timeouts: dict[str, str]
) -> None:
    _send(engine_target, "/v1/completions", body, timeouts)


@settings(max_examples=ENGINE_EXAMPLES)
@given(body=fs.engine_responses_bodies(), timeouts=fs.sdk_timeouts)
def test_engine_responses_bodies(
    engine_target: Target, body: bytes, timeouts: dict[str, str]
) -> None:
    _send(engine_target, "/v1/responses", body, timeouts)
