"""SSE framing, ordering, concurrency and cancellation of OpenAI streams."""

from __future__ import annotations

import asyncio
import json
import threading
from typing import Any

import httpx
import openai
from httpx_sse import connect_sse

from tests.support import ServerThread, scaled, wait_until
from tests.support import run_async as run
from tests.support.models.streams import CLOSED, GATES

CHAT = "/v1/chat/completions"
MESSAGES = [{"role": "user", "content": "str.split"}]
WAIT_S = scaled(10.0)


def test_exact_sse_framing(server: ServerThread) -> None:
    body = {
        "model": "tinyllm",
        "messages": MESSAGES,
        "max_tokens": 10,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    with httpx.stream("POST", server.url + CHAT, json=body) as r:
        assert r.status_code == 200
        assert r.headers["content-type"] == "text/event-stream"
        assert r.headers["cache-control"] == "no-cache"
        raw = r.read()
    assert raw.endswith(b"\n\n")
    events = raw[:-2].split(b"\n\n")
    for event in events:
        assert event.startswith(b"data: ")
        assert b"\n" not in event  # one data: line per event
    assert events[-1] == b"data: [DONE]"
    chunks = [json.loads(e[6:]) for e in events[:-1]]
    assert len({c["id"] for c in chunks}) == 1
    assert len({c["created"] for c in chunks}) == 1
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert [c["choices"][0]["finish_reason"] for c in chunks[:-1]].count(None) == len(chunks) - 2
    assert chunks[-2]["choices"][0]["delta"] == {}
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == 10


def test_httpx_sse_reads_every_event(server: ServerThread) -> None:
    body = {"model": "echo", "prompt": "a b c", "max_tokens": 7, "stream": True}
    with (
        httpx.Client() as c,
        connect_sse(c, "POST", server.url + "/v1/completions", json=body) as es,
    ):
        events = [sse for sse in es.iter_sse()]
    assert all(e.event == "message" for e in events)
    assert events[-1].data == "[DONE]"
    texts = [json.loads(e.data)["choices"][0]["text"] for e in events[:-1]]
    assert "".join(texts) == "a b c a b c a"
    assert len(texts) == 8  # 7 pieces, then the finish chunk with ""


def test_first_event_arrives_before_the_last_is_made(server: ServerThread) -> None:
    """A 200-token stream whose model waits, after its first token, until the client has
    that token's event: the first event cannot have been held back until the end."""
    key = "gate-200"
    GATES[key] = threading.Event()
    body = {"model": "gated", "prompt": key, "max_tokens": 200, "stream": True}
    with (
        httpx.Client() as c,
        connect_sse(c, "POST", server.url + "/v1/completions", json=body) as es,
    ):
        it = es.iter_sse()
        first = json.loads(next(it).data)
        assert first["choices"][0]["text"] == "t0"
        GATES[key].set()
        rest = [e.data for e in it]
    assert rest[-1] == "[DONE]"
    texts = [json.loads(d)["choices"][0]["text"] for d in rest[:-1]]
    assert len(texts) == 200  # 199 pieces and the finish chunk
    assert "".join(["t0", *texts]).split() == [f"t{i}" for i in range(200)]


def test_twenty_concurrent_streams_equal_their_references(server: ServerThread) -> None:
    """Twenty streams at once, each equal to its own sequential, non-streamed reference:
    greedy ones (temperature 0), and seeded sampling ones, whose texts differ (the demo
    model's greedy answers are much alike), so crossed streams would be caught."""
    jobs: list[dict[str, Any]] = [
        {"prompt": f"item {i} of the list", "temperature": 0.0}
        if i % 2 == 0
        else {"prompt": f"item {i} of the list", "temperature": 1.0, "seed": i}
        for i in range(20)
    ]

    async def main() -> tuple[list[str], list[str]]:
        async with server.async_client() as c:

            async def ref(job: dict[str, Any]) -> str:
                r = await c.completions.create(model="tinyllm", max_tokens=24, **job)
                return r.choices[0].text

            async def streamed(job: dict[str, Any]) -> str:
                text = ""
                stream = await c.completions.create(
                    model="tinyllm", max_tokens=24, stream=True, **job
                )
                async for chunk in stream:
                    text += chunk.choices[0].text if chunk.choices else ""
                return text

            refs = [await ref(job) for job in jobs]
            got = await asyncio.gather(*(streamed(job) for job in jobs))
            return refs, list(got)

    refs, got = run(main())
    assert got == refs
    assert len(set(refs[1::2])) == 10


def test_closing_a_stream_stops_generation(server: ServerThread, client: openai.OpenAI) -> None:
    stream = client.chat.completions.create(model="endless", messages=MESSAGES, stream=True)  # type: ignore[arg-type]
    it = iter(stream)
    for _ in range(3):
        next(it)
    stream.close()
    assert CLOSED.acquire(timeout=WAIT_S)  # the model's generator was closed
    # The generator closes on its thread before the handler, on the event loop, lets go
    # of the request's place; wait for that release rather than race it.
    wait_until(lambda: server.in_flight("endless") == 0, 10.0, "the stream's release")
    # Later requests are unaffected, on this model (queue depth 1) and on others.
    r = client.chat.completions.create(model="endless", messages=MESSAGES, max_tokens=3)  # type: ignore[arg-type]
    assert r.choices[0].message.content == "x x x "
    r2 = client.completions.create(model="echo", prompt="still fine", max_tokens=2)
    assert r2.choices[0].text == "still fine"


def test_async_client_breaking_out_closes_the_stream(server: ServerThread) -> None:
    async def main() -> Any:
        async with server.async_client() as c:
            stream = await c.chat.completions.create(
                model="endless",
                messages=MESSAGES,
                stream=True,  # type: ignore[arg-type]
            )
            n = 0
            async for _ in stream:
                n += 1
                if n == 5:
                    break
            await stream.close()

    run(main())
    assert CLOSED.acquire(timeout=WAIT_S)
    assert server.in_flight("endless") == 0
