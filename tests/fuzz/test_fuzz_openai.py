"""Hostile bodies for the OpenAI decoders (chat, completions, embeddings), through the
real server: always a 2xx or an OpenAI-format 4xx, never a 5xx, nothing left held."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st
from tests.fuzz import strategies as fs
from tests.fuzz.checks import assert_answer
from tests.fuzz.conftest import Target

_ACCEPT = st.sampled_from([None, "application/json", "text/event-stream"])


def _send(target: Target, path: str, body: bytes, accept: str | None) -> None:
    headers = {"content-type": "application/json"}
    if accept is not None:
        headers["accept"] = accept
    r = target.send("POST", path, body, headers=headers)
    assert_answer(target, r, "openai")


@given(body=fs.chat_bodies(), accept=_ACCEPT)
def test_chat_bodies(target: Target, body: bytes, accept: str | None) -> None:
    _send(target, "/v1/chat/completions", body, accept)


@given(body=fs.completion_bodies(), accept=_ACCEPT)
def test_completion_bodies(target: Target, body: bytes, accept: str | None) -> None:
    _send(target, "/v1/completions", body, accept)


@given(body=fs.embedding_bodies())
def test_embedding_bodies(target: Target, body: bytes) -> None:
    _send(target, "/v1/embeddings", body, None)
