"""Hostile bodies for the OpenAI decoders (chat, completions, embeddings), and hostile
SDK timeout headers, through the real server: always a 2xx or an OpenAI-format 4xx (a
504 when the request's own timeout asked for it), never a 5xx, nothing left held."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from tests.fuzz import strategies as fs
from tests.fuzz.checks import assert_answer
from tests.fuzz.conftest import Target

_ACCEPT = st.sampled_from([None, "application/json", "text/event-stream"])


def _send(
    target: Target,
    path: str,
    body: bytes,
    accept: str | None,
    timeouts: dict[str, str] | None = None,
) -> None:
    headers = {"content-type": "application/json", **(timeouts or {})}
    if accept is not None:
        headers["accept"] = accept
    r = target.send("POST", path, body, headers=headers)
    assert_answer(target, r, "openai", timed=bool(timeouts))


@given(body=fs.chat_bodies(), accept=_ACCEPT, timeouts=fs.sdk_timeouts)
def test_chat_bodies(
    target: Target, body: bytes, accept: str | None, timeouts: dict[str, str]
) -> None:
    _send(target, "/v1/chat/completions", body, accept, timeouts)


@given(body=fs.completion_bodies(), accept=_ACCEPT, timeouts=fs.sdk_timeouts)
def test_completion_bodies(
    target: Target, body: bytes, accept: str | None, timeouts: dict[str, str]
) -> None:
    _send(target, "/v1/completions", body, accept, timeouts)


@given(body=fs.embedding_bodies(), timeouts=fs.sdk_timeouts)
def test_embedding_bodies(target: Target, body: bytes, timeouts: dict[str, str]) -> None:
    _send(target, "/v1/embeddings", body, None, timeouts)
