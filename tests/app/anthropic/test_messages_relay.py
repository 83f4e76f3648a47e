"""A ``remote:`` model relays the Messages API undecoded: the body (its ``"model"``
rewritten) to the upstream's ``/messages`` route, the client's ``anthropic-version``
with it, and the upstream key as ``x-api-key`` (how Anthropic's API takes it). The
answers of a real upstream zeroserve are in ``test_messages_sdk.py``; here a scripted
upstream shows what the relay sends."""

from __future__ import annotations

import asyncio

import httpx
import msgspec
import pytest

from tests.app.relay.gateway_helpers import Fake, answer_ok, gateway


def test_the_upstream_key_goes_as_x_api_key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ZS_TEST_MESSAGES_KEY", "sk-upstream")

    async def main() -> None:
        async with (
            Fake(answer_ok) as fake,
            gateway(
                f"g=remote:{fake.url}?upstream_model=real-name&api_key_env=ZS_TEST_MESSAGES_KEY"
            ) as gw,
        ):
            body = {"model": "g", "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}]}
            async with httpx.AsyncClient() as c:
                for path in ("/v1/messages", "/v1/messages/count_tokens"):
                    r = await c.post(
                        gw.url + path,
                        json=body,
                        headers={"x-api-key": "client-key", "anthropic-version": "2023-06-01"},
                    )
                    assert r.status_code == 200
            for sent, path in zip(
                fake.requests, ("/messages", "/messages/count_tokens"), strict=True
            ):
                assert sent.head.startswith(b"POST /v1" + path.encode() + b" ")
                assert sent.header(b"x-api-key") == b"sk-upstream"  # not the client's
                assert sent.header(b"authorization") is None
                assert sent.header(b"anthropic-version") == b"2023-06-01"
                assert msgspec.json.decode(sent.body)["model"] == "real-name"

    asyncio.run(asyncio.wait_for(main(), 30))
