"""The gateway over real loopback HTTP: zeroserve relaying zeroserve, and purpose-built
upstreams that misbehave on cue. Tests wait on events, never on sleeps or timings."""

from __future__ import annotations

import asyncio
import hashlib
from typing import Any

import httpx
import msgspec
import pytest

from tests.app.relay.gateway_helpers import (
    Fake,
    answer_ok,
    answer_status,
    assert_no_leaks,
    chunk,
    chunked_head,
    closed_port,
    echo_upstream,
    gateway,
    never_answer,
    pattern,
    reset_mid_stream,
    stall_after_first_chunk,
)
from tests.support import scaled

SSE = {"accept": "text/event-stream"}


async def post(client: httpx.AsyncClient, url: str, body: bytes, **kw: Any) -> httpx.Response:
    return await client.post(url, content=body, **kw)


# -- byte-for-byte relaying ----------------------------------------------------------------


def test_raw_bodies_and_streams_equal_the_upstreams_own(run: Any) -> None:
    async def main() -> None:
        async with (
            echo_upstream() as up,
            gateway(f"g=remote:{up.url}/v1?upstream_model=echo") as gw,
        ):
            direct = f"{up.url}/v1/raw/echo"
            relayed = f"{gw.url}/v1/raw/g"
            async with httpx.AsyncClient(timeout=scaled(20)) as c:
                for size in (0, 1, 100_000, 3 << 20):
                    body = pattern(size, seed=size)
                    a = await post(c, direct, body)
                    b = await post(c, relayed, body)
                    assert (b.status_code, b.content) == (a.status_code, a.content) == (200, body)
                    assert b.headers["content-type"] == a.headers["content-type"]
                words = b" ".join(b"w%d" % i for i in range(300))
                for params, headers in (
                    ("?max_tokens=5000", SSE),
                    ("?stream=1&max_tokens=5000", {}),
                ):
                    a = await post(c, direct + params, words, headers=headers)
                    b = await post(c, relayed + params, words, headers=headers)
                    assert b.status_code == a.status_code == 200
                    assert b.content == a.content and len(b.content) > 10_000
                    assert b.headers["content-type"] == a.headers["content-type"]
            relay = gw.relay()
            st = relay.statistics().upstreams[f"{up.url}/v1"]
            assert st.requests == 6 and st.errors == 0
            assert st.connects == 1 and st.reused == 5  # one keep-alive connection
            assert_no_leaks(relay)

    run(main())


def test_upstream_status_headers_and_4xx_bodies_pass_through(run: Any) -> None:
    async def teapot(fake: Fake, req: Any, r: Any, w: Any) -> bool:
        body = b'{"error":{"message":"short and stout","type":"invalid_request_error"}}'
        await fake.send(
            w,
            b"HTTP/1.1 418 I'm a teapot\r\ncontent-type: application/json\r\nx-upstream: yes\r\n"
            b"connection: keep-alive\r\nkeep-alive: timeout=5\r\ncontent-length: %d\r\n\r\n%s"
            % (len(body), body),
        )
        return True

    async def main() -> None:
        async with Fake(teapot) as fake, gateway(f"g=remote:{fake.url}") as gw:
            async with httpx.AsyncClient() as c:
                r = await post(
                    c,
                    f"{gw.url}/v1/raw/g?a=1",
                    b"x",
                    headers={"x-client": "1", "authorization": "c"},
                )
            assert r.status_code == 418
            assert r.json()["error"]["message"] == "short and stout"
            assert r.headers["x-upstream"] == "yes"
            assert "keep-alive" not in r.headers
            head = fake.requests[0].head
            assert head.startswith(b"POST /v1/raw/g?a=1 HTTP/1.1\r\n")
            assert fake.requests[0].header(b"x-client") == b"1"
            # The client's key is for the gateway: not passed on unless asked.
            assert fake.requests[0].header(b"authorization") is None
            # The upstream logs the request id the client was given.
            assert fake.requests[0].header(b"x-request-id") == r.headers["x-request-id"].encode()
            st = gw.relay().statistics().upstreams[fake.url]
            assert st.errors == 0  # a 4xx is the client's problem, not the upstream's
            assert_no_leaks(gw.relay())

    run(main())


def test_client_key_and_request_id_are_forwarded_when_asked(run: Any) -> None:
    async def main() -> None:
        async with (
            Fake(answer_ok) as fake,
            gateway(f"g=remote:{fake.url}?forward_client_key=true") as gw,
        ):
            async with httpx.AsyncClient() as c:
                headers = {
                    "authorization": "Bearer client-key",
                    "x-api-key": "k2",
                    "x-request-id": "trace-me-1",
                }
                r = await post(c, f"{gw.url}/v1/raw/g", b"x", headers=headers)
            assert r.status_code == 200 and r.headers["x-request-id"] == "trace-me-1"
            sent = fake.requests[0]
            assert sent.header(b"authorization") == b"Bearer client-key"
            assert sent.header(b"x-api-key") == b"k2"
            assert sent.header(b"x-request-id") == b"trace-me-1"

    run(main())


def test_model_rewrite_and_api_key_header(run: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ZS_TEST_UPSTREAM_KEY", "sk-secret")

    async def main() -> None:
        async with (
            Fake(answer_ok) as fake,
            gateway(
                f"g=remote:{fake.url}?upstream_model=real-name&api_key_env=ZS_TEST_UPSTREAM_KEY"
            ) as gw,
        ):
            prompt = "p " * 10000
            body = msgspec.json.encode(
                {"model": "g", "messages": [{"role": "user", "content": prompt}], "n": 1}
            )
            relay = gw.relay()
            async with httpx.AsyncClient() as c:
                # Through the relay's own entry (what the OpenAI endpoints call).
                r = await post(
                    c, f"{gw.url}/v1/raw/g", body, headers={"authorization": "Bearer client"}
                )
            assert r.status_code == 200
            sent = fake.requests[0]
            assert sent.header(b"authorization") == b"Bearer sk-secret"
            assert sent.body == body  # raw: never rewritten
            assert sent.head.startswith(b"POST /v1/raw/real-name ")
            assert relay.upstream_model == "real-name"

    run(main())


# -- fail-over, health, errors -------------------------------------------------------------


def test_refused_upstream_fails_over_and_is_ejected(run: Any) -> None:
    async def main() -> None:
        dead = f"http://127.0.0.1:{closed_port()}/v1"
        async with (
            echo_upstream() as up,
            gateway(
                f"g=remote:{dead},{up.url}/v1?upstream_model=echo&max_fails=2&eject_s=30"
            ) as gw,
        ):
            relay = gw.relay()
            async with httpx.AsyncClient() as c:
                for i in range(8):
                    r = await post(c, f"{gw.url}/v1/raw/g", b"hello %d" % i)
                    assert (r.status_code, r.content) == (200, b"hello %d" % i)
            stats = relay.statistics()
            bad, good = stats.upstreams[dead], stats.upstreams[f"{up.url}/v1"]
            assert bad.errors == 2 and bad.ejected and bad.ejections == 1
            assert good.requests == 8 and good.errors == 0
            assert stats.retries == 2
            assert_no_leaks(relay)

    run(main())


def test_5xx_before_any_byte_is_retried_elsewhere_once(run: Any) -> None:
    async def main() -> None:
        async with (
            Fake(answer_status(500)) as f1,
            Fake(answer_status(503)) as f2,
            Fake(answer_ok) as ok,
            gateway(f"g=remote:{f1.url},{f2.url}") as two,
            gateway(f"g=remote:{f1.url},{ok.url}?max_fails=100") as healthy,
        ):
            async with httpx.AsyncClient() as c:
                # Both fail: one retry only, then the last upstream's 5xx is passed through.
                r = await post(c, f"{two.url}/v1/raw/g", b"x")
                assert r.status_code in (500, 503)
                assert r.json()["error"]["message"] == "nope"
                assert len(f1.requests) + len(f2.requests) == 2
                for _ in range(6):
                    r = await post(c, f"{healthy.url}/v1/raw/g", b"x")
                    assert r.status_code == 200 and r.json() == {"ok": True}
            relay = healthy.relay()
            assert relay.statistics().retries == len(f1.requests) - 1
            assert_no_leaks(relay)
            assert_no_leaks(two.relay())

    run(main())


def test_unreachable_502_then_ejected_503_with_retry_after(run: Any) -> None:
    async def main() -> None:
        dead = f"http://127.0.0.1:{closed_port()}/v1"
        async with gateway(f"g=remote:{dead}?max_fails=1&eject_s=30") as gw:
            relay = gw.relay()
            async with httpx.AsyncClient() as c:
                r = await post(c, f"{gw.url}/v1/raw/g", b"x")
                assert r.status_code == 502
                assert r.json()["error"]["code"] == "upstream_unreachable"
                r = await post(c, f"{gw.url}/v1/raw/g", b"x")
                assert r.status_code == 503
                assert r.json()["error"]["code"] == "upstream_unavailable"
                assert 1 <= int(r.headers["retry-after"]) <= 30
                # After the cool-down (a clock moved, not a sleep) it is tried again.
                real = relay.clock
                relay.clock = lambda: real() + 31
                r = await post(c, f"{gw.url}/v1/raw/g", b"x")
                assert r.status_code == 502
            st = relay.statistics()
            assert (st.unreachable, st.unavailable) == (2, 1)
            assert st.upstreams[dead].ejections == 2  # half-open: one more failure, out again

    run(main())


def test_a_pooled_connection_closed_while_idle_is_replaced_transparently(run: Any) -> None:
    async def once_per_connection(fake: Fake, req: Any, r: Any, w: Any) -> bool:
        if req.number > 1:
            return False  # keep-alive race: the upstream closes instead of answering
        await fake.send(w, b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok")
        return True

    async def main() -> None:
        async with Fake(once_per_connection) as fake, gateway(f"g=remote:{fake.url}") as gw:
            async with httpx.AsyncClient() as c:
                for _ in range(3):
                    r = await post(c, f"{gw.url}/v1/raw/g", b"x")
                    assert (r.status_code, r.content) == (200, b"ok")
            st = gw.relay().statistics().upstreams[fake.url]
            assert st.errors == 0 and st.connects == 3
            assert_no_leaks(gw.relay())

    run(main())


# -- cancellation, deadlines, backpressure -------------------------------------------------


async def raw_request(port: int, path: str, body: bytes, headers: bytes = b"") -> tuple[Any, Any]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(
        b"POST %s HTTP/1.1\r\nhost: t\r\ncontent-length: %d\r\n%s\r\n"
        % (path.encode(), len(body), headers)
        + body
    )
    return reader, writer


def test_client_disconnect_mid_stream_closes_the_upstream_connection(run: Any) -> None:
    async def main() -> None:
        async with Fake(stall_after_first_chunk) as fake, gateway(f"g=remote:{fake.url}") as gw:
            reader, writer = await raw_request(gw.port, "/v1/raw/g", b"x")
            await reader.readuntil(b"data: first\n\n")  # the stream is flowing
            writer.transport.abort()
            await fake.peer_closed.wait()  # the upstream sees its connection closed
            relay = gw.relay()
            await _until(lambda: relay.statistics().upstreams[fake.url].in_flight == 0)
            st = relay.statistics()
            assert st.client_disconnects == 1
            assert st.upstreams[fake.url].connections == 0  # aborted, not pooled

    run(main())


def test_client_disconnect_before_the_upstream_answers(run: Any) -> None:
    async def main() -> None:
        async with Fake(never_answer) as fake, gateway(f"g=remote:{fake.url}") as gw:
            _, writer = await raw_request(gw.port, "/v1/raw/g", b"x")
            await fake.request_seen.wait()
            writer.transport.abort()
            await fake.peer_closed.wait()
            relay = gw.relay()
            await _until(lambda: relay.statistics().upstreams[fake.url].in_flight == 0)
            assert relay.statistics().upstreams[fake.url].connections == 0
            assert gw.engine.statistics().models["g"].queue.in_flight == 0  # ticket released

    run(main())


def test_deadline_before_the_first_byte_is_a_504_in_openai_format(run: Any) -> None:
    async def main() -> None:
        async with (
            Fake(never_answer) as fake,
            gateway(f"g=remote:{fake.url}?timeout=0.2") as gw,
            httpx.AsyncClient() as c,
        ):
            r = await post(c, f"{gw.url}/v1/raw/g", b"x")
            assert r.status_code == 504
            err = r.json()["error"]
            assert err["code"] == "deadline_exceeded" and err["type"] == "timeout_error"
            await fake.peer_closed.wait()
            assert_no_leaks(gw.relay())
        async with (
            Fake(never_answer) as fake,
            gateway(f"g=remote:{fake.url}?first_byte_timeout=0.2") as gw,
            httpx.AsyncClient() as c,
        ):
            r = await post(c, f"{gw.url}/v1/raw/g", b"x")
            assert r.status_code == 504
            await fake.peer_closed.wait()

    run(main())


def test_deadline_covers_the_whole_stream(run: Any) -> None:
    async def main() -> None:
        async with (
            Fake(stall_after_first_chunk) as fake,
            gateway(f"g=remote:{fake.url}?timeout=0.3") as gw,
            httpx.AsyncClient() as c,
        ):
            got = b""
            with pytest.raises(httpx.RemoteProtocolError):  # cut short: no last chunk
                async with c.stream("POST", f"{gw.url}/v1/raw/g", content=b"x") as r:
                    assert r.status_code == 200
                    async for part in r.aiter_raw():
                        got += part
            assert got == b"data: first\n\n"
            await fake.peer_closed.wait()
            relay = gw.relay()
            assert relay.statistics().timeouts == 1
            assert_no_leaks(relay)

    run(main())


def test_reset_mid_stream_cuts_the_client_stream_and_leaks_nothing(run: Any) -> None:
    async def main() -> None:
        async with Fake(reset_mid_stream) as fake, gateway(f"g=remote:{fake.url}") as gw:
            async with httpx.AsyncClient() as c:
                got = b""
                with pytest.raises(httpx.RemoteProtocolError):
                    async with c.stream("POST", f"{gw.url}/v1/raw/g", content=b"x") as r:
                        async for part in r.aiter_raw():
                            got += part
                assert b"data: one\n\n".startswith(got[:11])
                # The gateway still serves the next request on a fresh connection.
                r = await post(c, f"{gw.url}/v1/raw/g", b"x")
                assert r.status_code == 200
            relay = gw.relay()
            await _until(lambda: relay.statistics().upstreams[fake.url].in_flight == 0)
            assert relay.statistics().upstreams[fake.url].errors >= 1
            assert_no_leaks(relay)

    run(main())


def test_slow_client_fast_upstream_memory_stays_bounded(run: Any) -> None:
    total = 48 << 20
    piece = pattern(64 * 1024, seed=3)

    async def firehose(fake: Fake, req: Any, r: Any, w: Any) -> bool:
        await fake.send(w, chunked_head(content_type=b"application/octet-stream"))
        for _ in range(total // len(piece)):
            await fake.send(w, chunk(piece))
        await fake.send(w, b"0\r\n\r\n")
        return True

    async def main() -> None:
        queue = 128 * 1024
        async with (
            Fake(firehose) as fake,
            gateway(f"g=remote:{fake.url}?queue_bytes={queue}") as gw,
        ):
            relay = gw.relay()
            reader, writer = await raw_request(gw.port, "/v1/raw/g", b"x")
            await reader.readuntil(b"\r\n\r\n")
            # The client reads nothing: the upstream must end up blocked on its writes.
            await fake.blocked.wait()
            await _until(lambda: relay.statistics().upstreams[fake.url].read_pauses > 0)
            st = relay.statistics().upstreams[fake.url]
            read_max = 256 * 1024  # one transport read, asyncio and uvloop
            assert st.pending_bytes <= queue + read_max
            assert fake.bytes_sent < total // 2  # the rest is still upstream, not in us
            # Now read it all: every byte arrives, in order.
            digest = hashlib.sha256()
            body = 0
            while True:
                size_line = await reader.readuntil(b"\r\n")
                n = int(size_line.split(b";")[0], 16)
                data = await reader.readexactly(n + 2)
                if not n:
                    break
                digest.update(data[:-2])
                body += n
            writer.close()
            expected = hashlib.sha256(piece * (total // len(piece))).hexdigest()
            assert body == total and digest.hexdigest() == expected
            st = relay.statistics().upstreams[fake.url]
            assert st.peak_pending_bytes <= queue + read_max
            assert st.read_pauses > 1 and st.coalesced > 0
            assert_no_leaks(relay)

    run(main())


async def _until(cond: Any) -> None:
    """Yield to the loop until ``cond()`` holds (bounded by the test's timeout)."""
    while not cond():
        await asyncio.sleep(0)


def test_connection_limit_queues_requests_and_reuses_connections(run: Any) -> None:
    async def main() -> None:
        async with (
            echo_upstream() as up,
            gateway(f"g=remote:{up.url}/v1?upstream_model=echo&connections=2") as gw,
        ):
            relay = gw.relay()
            async with httpx.AsyncClient(limits=httpx.Limits(max_connections=50)) as c:
                bodies = [b"request %d " % i * 50 for i in range(40)]
                results = await asyncio.gather(*(post(c, f"{gw.url}/v1/raw/g", b) for b in bodies))
            assert [r.content for r in results] == bodies
            st = relay.statistics().upstreams[f"{up.url}/v1"]
            assert st.connects <= 2 and st.requests == 40 and st.errors == 0
            assert_no_leaks(relay)

    run(main())


def test_least_outstanding_requests_spreads_concurrent_load(run: Any) -> None:
    async def main() -> None:
        async with (
            Fake(never_answer) as slow,
            echo_upstream() as up,
            gateway(f"g=remote:{slow.url},{up.url}/v1?upstream_model=echo") as gw,
        ):
            async with httpx.AsyncClient(timeout=scaled(10)) as c:
                # One request sticks on the slow upstream; every later one goes to the
                # upstream with fewer requests outstanding, the echo.
                seen = asyncio.ensure_future(slow.request_seen.wait())
                while True:  # ties go in turn: send until one lands on the slow upstream
                    stuck = asyncio.ensure_future(post(c, f"{gw.url}/v1/raw/g", b"stuck"))
                    await asyncio.wait([stuck, seen], return_when=asyncio.FIRST_COMPLETED)
                    if seen.done():
                        break
                for i in range(10):
                    r = await post(c, f"{gw.url}/v1/raw/g", b"fast %d" % i)
                    assert r.content == b"fast %d" % i
                assert len(slow.requests) == 1
                stuck.cancel()
            await slow.peer_closed.wait()
            assert_no_leaks(gw.relay())

    run(main())
