"""The ``openai`` SDK talking to zeroserve relaying another zeroserve: the same
answers as from the upstream directly, streamed and not, plus the CLI path
(``zeroserve serve --model NAME=remote:URL``) in a real process."""

from __future__ import annotations

from typing import Any

import httpx
import openai
import pytest

from tests.app.relay.gateway_helpers import echo_upstream, gateway

MESSAGES: Any = [{"role": "user", "content": "alpha beta gamma delta"}]


def _text(chunks: list[Any]) -> str:
    return "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)


def test_openai_sdk_through_the_gateway_matches_the_upstream(run: Any) -> None:
    async def main() -> None:
        async with (
            echo_upstream() as up,
            gateway(f"g=remote:{up.url}/v1?upstream_model=echo") as gw,
        ):
            direct = openai.AsyncOpenAI(base_url=f"{up.url}/v1", api_key="x", max_retries=0)
            relayed = openai.AsyncOpenAI(base_url=f"{gw.url}/v1", api_key="x", max_retries=0)
            models = await relayed.models.list()
            assert [m.id for m in models.data] == ["g"]

            a = await direct.chat.completions.create(model="echo", messages=MESSAGES, max_tokens=9)
            b = await relayed.chat.completions.create(model="g", messages=MESSAGES, max_tokens=9)
            assert b.choices[0].message.content == a.choices[0].message.content
            assert b.usage == a.usage and b.model == "echo"  # the upstream's answer, as is

            kw: Any = {"max_tokens": 40, "stream": True, "stream_options": {"include_usage": True}}
            sa = [
                c
                async for c in await direct.chat.completions.create(
                    model="echo", messages=MESSAGES, **kw
                )
            ]
            sb = [
                c
                async for c in await relayed.chat.completions.create(
                    model="g", messages=MESSAGES, **kw
                )
            ]
            assert _text(sb) == _text(sa) and len(sb) == len(sa) > 10
            assert sb[-1].usage == sa[-1].usage

            ca = await direct.completions.create(model="echo", prompt="one two three", max_tokens=7)
            cb = await relayed.completions.create(model="g", prompt="one two three", max_tokens=7)
            assert cb.choices[0].text == ca.choices[0].text

            ea = await direct.embeddings.create(model="echo", input=["x", "y z"])
            eb = await relayed.embeddings.create(model="g", input=["x", "y z"])
            assert [e.embedding for e in eb.data] == [e.embedding for e in ea.data]

            # Parameters only the upstream judges pass through untouched, errors included.
            with pytest.raises(openai.BadRequestError) as info:
                await relayed.chat.completions.create(model="g", messages=MESSAGES, logprobs=True)
            assert info.value.status_code == 400
            await direct.close()
            await relayed.close()
            st = gw.relay().statistics()
            assert st.upstreams[f"{up.url}/v1"].errors == 0

    run(main())


def test_sse_bytes_through_the_gateway_equal_the_upstreams(run: Any) -> None:
    async def main() -> None:
        async with (
            echo_upstream() as up,
            gateway(f"g=remote:{up.url}/v1?upstream_model=echo") as gw,
        ):
            body = (
                b'{"model":"%s","prompt":"a b c d e f g","max_tokens":300,"stream":true,"seed":1}'
            )
            async with httpx.AsyncClient() as c:
                a = await c.post(f"{up.url}/v1/completions", content=body % b"echo")
                b = await c.post(f"{gw.url}/v1/completions", content=body % b"g")
            strip = [line for line in a.content.split(b"\n") if line]
            assert len(strip) > 300
            # Ids and timestamps differ per request; everything else is the same bytes.
            assert _normalise(b.content) == _normalise(a.content)

    run(main())


def _normalise(sse: bytes) -> bytes:
    import re

    return re.sub(rb'"(id|created)":("[^"]*"|\d+)', b"", sse)


def test_cli_gateway_process_relays_raw_and_lists_the_model() -> None:
    from tests.support import start_server

    upstream = start_server("--model", "echo")
    try:
        gw = start_server("--model", f"g=remote:{upstream.url}/v1?upstream_model=echo")
        try:
            assert gw.models == ["g"]
            with httpx.Client() as c:
                r = c.post(f"{gw.url}/v1/raw/g", content=b"through a real process")
                assert (r.status_code, r.content) == (200, b"through a real process")
                r = c.post(
                    f"{gw.url}/v1/raw/g?max_tokens=4",
                    content=b"a b",
                    headers={"accept": "text/event-stream"},
                )
                assert r.content == b"data: a\n\ndata: b\n\ndata: a\n\ndata: b\n\n"
                metrics = c.get(f"{gw.url}/metrics").text
                assert 'zeroserve_upstream_requests_total{name="g ' in metrics
                assert "zeroserve_relay_overhead_seconds_bucket" in metrics
        finally:
            assert gw.stop() == 0
    finally:
        assert upstream.stop() == 0
