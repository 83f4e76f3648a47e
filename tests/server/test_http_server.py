"""The HTTP engine over real sockets, on uvloop and on asyncio (the loop_name fixture)."""

from __future__ import annotations

import os
import re
import signal
import socket
from collections.abc import Iterator

import httpx
import pytest

from tests.server.rawclient import RawClient, read_status
from tests.support import ServerProcess, scaled, start_server, wait_until

# A state the server reaches at once on a quiet machine (leases back, slots taken) is
# waited for this long (scaled).
WAIT_S = 10.0


def metric(server: ServerProcess, name: str) -> float:
    text = httpx.get(server.url + "/metrics").text
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name) and not line.startswith("#"):
            total += float(line.rsplit(" ", 1)[1])
    return total


def test_health_and_metrics(echo_server: ServerProcess) -> None:
    r = httpx.get(echo_server.url + "/health")
    assert r.status_code == 200 and r.json() == {"status": "ok"}
    r = httpx.get(echo_server.url + "/ready")
    assert r.status_code == 200
    text = httpx.get(echo_server.url + "/metrics").text
    assert "zeroserve_copied_bytes_total" in text or "zeroserve_payload_bytes_total" in text


def test_echo_8mib_is_byte_identical(echo_server: ServerProcess) -> None:
    body = os.urandom(8 << 20)
    r = httpx.post(echo_server.url + "/v1/raw/echo", content=body, timeout=scaled(30))
    assert r.status_code == 200
    assert r.headers["content-type"] == "application/octet-stream"
    assert r.content == body


def test_content_length_body_copies_stay_under_two_percent(echo_server: ServerProcess) -> None:
    before = metric(echo_server, "zeroserve_copied_bytes_total")
    body = os.urandom(64 << 10)
    with httpx.Client() as client:
        for _ in range(16):
            assert client.post(echo_server.url + "/v1/raw/echo", content=body).content == body
    # Only body bytes read together with the head are copied (at most one small window).
    copied = metric(echo_server, "zeroserve_copied_bytes_total") - before
    assert copied <= 0.02 * 16 * len(body)


def test_body_received_after_100_continue_is_never_copied(echo_server: ServerProcess) -> None:
    before = metric(echo_server, "zeroserve_copied_bytes_total")
    body = os.urandom(1 << 20)
    c = RawClient(echo_server.host, echo_server.port)
    try:
        for _ in range(4):
            c.send(
                b"POST /v1/raw/echo HTTP/1.1\r\nHost: t\r\nContent-Length: %d\r\n"
                b"Expect: 100-continue\r\n\r\n" % len(body)
            )
            assert c.sock.recv(64) == b"HTTP/1.1 100 Continue\r\n\r\n"
            c._note_request(b"POST /v1/raw/echo HTTP/1.1")
            c.send(body)
            r = c.read_response()
            assert r.status == 200 and r.body == body
    finally:
        c.close()
    # The kernel wrote every body byte straight into its lease, and echo answered from it.
    assert metric(echo_server, "zeroserve_copied_bytes_total") == before


def test_keep_alive_reuses_one_connection(echo_server: ServerProcess) -> None:
    c = RawClient(echo_server.host, echo_server.port)
    try:
        for i in range(5):
            body = b"x" * i
            r = c.request(
                b"POST /v1/raw/echo HTTP/1.1\r\nHost: t\r\nContent-Length: %d\r\n\r\n%s"
                % (len(body), body)
            )
            assert r.status == 200 and r.body == body
    finally:
        c.close()


def test_pipelined_requests_answer_in_order(echo_server: ServerProcess) -> None:
    reqs = [
        b"GET /health HTTP/1.1\r\nHost: t\r\n\r\n",
        b"POST /v1/raw/echo HTTP/1.1\r\nHost: t\r\nContent-Length: 3\r\n\r\nabc",
        b"GET /nope HTTP/1.1\r\nHost: t\r\n\r\n",
        b"POST /v1/raw/echo HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nhi\r\n0\r\n\r\n",
        b"HEAD /health HTTP/1.1\r\nHost: t\r\n\r\n",
        b"GET /health HTTP/1.1\r\nHost: t\r\n\r\n",
    ]
    c = RawClient(echo_server.host, echo_server.port)
    try:
        c.send(b"".join(reqs))
        got = []
        for raw in reqs:
            c._note_request(raw)
            r = c.read_response()
            got.append((r.status, r.body))
    finally:
        c.close()
    assert [g[0] for g in got] == [200, 200, 404, 200, 200, 200]
    assert got[1][1] == b"abc" and got[3][1] == b"hi" and got[4][1] == b""


def test_many_pipelined_requests_do_not_recurse(echo_server: ServerProcess) -> None:
    req = b"GET /health HTTP/1.1\r\nHost: t\r\n\r\n"
    c = RawClient(echo_server.host, echo_server.port)
    try:
        c.send(req * 2000)
        for _ in range(2000):
            c._note_request(req)
            assert c.read_response().status == 200
    finally:
        c.close()


def test_http10_closes_after_response(echo_server: ServerProcess) -> None:
    c = RawClient(echo_server.host, echo_server.port)
    try:
        c.send(b"POST /v1/raw/echo HTTP/1.0\r\nContent-Length: 2\r\n\r\nhi")
        raw = c.wait_closed()
    finally:
        c.close()
    assert read_status(raw) == 200 and raw.endswith(b"\r\n\r\nhi")
    assert b"connection: close" in raw.lower()


def test_head_has_no_body(echo_server: ServerProcess) -> None:
    r = httpx.head(echo_server.url + "/health")
    assert r.status_code == 200 and r.content == b""
    assert int(r.headers["content-length"]) > 0


def test_chunked_upload_is_echoed(echo_server: ServerProcess) -> None:
    parts = [os.urandom(1000), os.urandom(70000), os.urandom(5)]
    r = httpx.post(echo_server.url + "/v1/raw/echo", content=iter(parts))
    assert r.status_code == 200 and r.content == b"".join(parts)


def test_sse_stream_one_event_per_token(echo_server: ServerProcess) -> None:
    tokens = [f"t{i}" for i in range(256)]
    with httpx.stream(
        "POST",
        echo_server.url + "/v1/raw/echo",
        content=" ".join(tokens),
        headers={"Accept": "text/event-stream"},
    ) as r:
        assert r.headers["content-type"] == "text/event-stream"
        assert r.headers["transfer-encoding"] == "chunked"
        raw = r.read()
    events = raw.split(b"\n\n")
    assert events[-1] == b""
    assert [e.decode() for e in events[:-1]] == [f"data: {t}" for t in tokens]


def test_octet_stream_pieces_with_max_tokens(echo_server: ServerProcess) -> None:
    r = httpx.post(echo_server.url + "/v1/raw/echo?stream=1&max_tokens=5", content=b"a bb c")
    assert r.status_code == 200 and r.content == b"abbcabb"


@pytest.mark.parametrize(
    ("request_bytes", "status"),
    [
        (
            b"POST /v1/raw/echo HTTP/1.1\r\nHost: t\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n",
            400,
        ),
        (
            b"POST /v1/raw/echo HTTP/1.1\r\nHost: t\r\nContent-Length: 3\r\nContent-Length: 4\r\n\r\n",
            400,
        ),
        (b"POST /v1/raw/echo HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: gzip\r\n\r\n", 400),
        (b"POST /v1/raw/echo HTTP/1.1\r\nContent-Length: 1\r\n\r\nx", 400),
        (
            b"POST /v1/raw/echo HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\nxyz\r\n",
            400,
        ),
        (b"GET /health HTTP/1.1\r\nHost: t\r\nBad Header: x\r\n\r\n", 400),
        (b"GET /" + b"a" * 9000 + b" HTTP/1.1\r\nHost: t\r\n\r\n", 414),
        (b"GET /health HTTP/1.1\r\nHost: t\r\nX-Big: " + b"b" * 17000 + b"\r\n\r\n", 431),
        (
            b"GET /health HTTP/1.1\r\nHost: t\r\n"
            + b"".join(b"X-%d: y\r\n" % i for i in range(101))
            + b"\r\n",
            431,
        ),
        (
            b"POST /v1/raw/echo HTTP/1.1\r\nHost: t\r\nExpect: something\r\nContent-Length: 1\r\n\r\n",
            417,
        ),
    ],
    ids=[
        "cl+te",
        "dup-cl",
        "te-gzip",
        "no-host",
        "bad-chunk",
        "bad-header",
        "uri",
        "head",
        "count",
        "expect",
    ],
)
def test_protocol_errors_get_status_and_json(
    echo_server: ServerProcess, request_bytes: bytes, status: int
) -> None:
    c = RawClient(echo_server.host, echo_server.port)
    try:
        c.send(request_bytes)
        raw = c.wait_closed() if status != 417 else c.sock.recv(65536)
    finally:
        c.close()
    assert read_status(raw) == status
    assert b'"error"' in raw and b"content-type: application/json" in raw
    assert httpx.get(echo_server.url + "/health").status_code == 200


def test_oversized_body_is_refused_before_it_is_sent(loop_name: str) -> None:
    server = start_server("--model", "echo", "--max-body-bytes", "1000", loop=loop_name)
    try:
        c = RawClient(server.host, server.port)
        try:
            # Expect: 100-continue: the server must answer 413 at once, never 100.
            c.send(
                b"POST /v1/raw/echo HTTP/1.1\r\nHost: t\r\nContent-Length: 5000\r\nExpect: 100-continue\r\n\r\n"
            )
            raw = c.wait_closed()
        finally:
            c.close()
        assert read_status(raw) == 413 and b"100 Continue" not in raw
        # A body within the limit still works afterwards.
        assert httpx.post(server.url + "/v1/raw/echo", content=b"x" * 1000).content == b"x" * 1000
    finally:
        assert server.stop() == 0


def test_expect_continue_gets_100_then_response(echo_server: ServerProcess) -> None:
    c = RawClient(echo_server.host, echo_server.port)
    try:
        c.send(
            b"POST /v1/raw/echo HTTP/1.1\r\nHost: t\r\nContent-Length: 4\r\nExpect: 100-continue\r\n\r\n"
        )
        first = c.sock.recv(1024)
        assert first == b"HTTP/1.1 100 Continue\r\n\r\n"
        c.send(b"data")
        c.conn.send(h11_request())
        c.conn.send(h11_eom())
        r = c.read_response()
        assert r.status == 200 and r.body == b"data"
    finally:
        c.close()


def h11_request():  # type: ignore[no-untyped-def]
    import h11

    return h11.Request(method="POST", target="/", headers=[("Host", "t"), ("Content-Length", "4")])


def h11_eom():  # type: ignore[no-untyped-def]
    import h11

    return h11.Data(data=b"data")


def test_unknown_model_404_before_body(echo_server: ServerProcess) -> None:
    c = RawClient(echo_server.host, echo_server.port)
    try:
        c.send(
            b"POST /v1/raw/missing HTTP/1.1\r\nHost: t\r\nContent-Length: 100000\r\nExpect: 100-continue\r\n\r\n"
        )
        raw = c.wait_closed()
    finally:
        c.close()
    assert read_status(raw) == 404 and b"model_not_found" in raw


def test_method_not_allowed_lists_allow(echo_server: ServerProcess) -> None:
    r = httpx.delete(echo_server.url + "/v1/raw/echo")
    assert r.status_code == 405 and r.headers["allow"] == "POST"
    assert r.json()["error"]["code"] == "method_not_allowed"


def arena_leases(server: ServerProcess) -> float:
    return metric(server, "zeroserve_arena_leases")


def test_disconnect_mid_body_then_server_still_serves(echo_server: ServerProcess) -> None:
    c = RawClient(echo_server.host, echo_server.port)
    c.send(
        b"POST /v1/raw/echo HTTP/1.1\r\nHost: t\r\nContent-Length: 1000000\r\n\r\n" + b"a" * 5000
    )
    c.close()
    wait_until(lambda: arena_leases(echo_server) == 0, WAIT_S, "the arena's leases to be released")
    assert httpx.post(echo_server.url + "/v1/raw/echo", content=b"ok").content == b"ok"


def test_disconnect_mid_response_then_server_still_serves(echo_server: ServerProcess) -> None:
    c = RawClient(echo_server.host, echo_server.port)
    # An endless-looking stream: 10 million tokens; read a little and hang up.
    c.send(
        b"POST /v1/raw/echo?stream=1&max_tokens=4000000 HTTP/1.1\r\nHost: t\r\nContent-Length: 7\r\n\r\na b c d"
    )
    assert c.sock.recv(4096)
    c.sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
    c.close()
    wait_until(lambda: arena_leases(echo_server) == 0, WAIT_S, "the arena's leases to be released")
    assert httpx.get(echo_server.url + "/health").status_code == 200
    body = os.urandom(100000)
    assert httpx.post(echo_server.url + "/v1/raw/echo", content=body).content == body


@pytest.fixture(scope="module")
def strict_server(loop_name: str) -> Iterator[ServerProcess]:
    env = {
        "ZEROSERVE_TIMEOUTS__HEAD": "0.3",
        "ZEROSERVE_TIMEOUTS__BODY": "0.3",
        "ZEROSERVE_TIMEOUTS__KEEPALIVE": "0.3",
        "ZEROSERVE_MAX_CONNECTIONS": "8",
    }
    server = start_server("--model", "echo", env=env, loop=loop_name)
    yield server
    assert server.stop() == 0


def test_slow_head_is_timed_out(strict_server: ServerProcess) -> None:
    c = RawClient(strict_server.host, strict_server.port)
    try:
        c.send(b"GET /health HTTP/1.1\r\nHo")
        raw = c.wait_closed(timeout=scaled(5))
    finally:
        c.close()
    assert raw == b"" or read_status(raw) == 408


def test_silent_connection_is_closed(strict_server: ServerProcess) -> None:
    c = RawClient(strict_server.host, strict_server.port)
    try:
        assert c.wait_closed(timeout=scaled(5)) == b""
    finally:
        c.close()


def test_stalled_body_is_timed_out(strict_server: ServerProcess) -> None:
    c = RawClient(strict_server.host, strict_server.port)
    try:
        c.send(b"POST /v1/raw/echo HTTP/1.1\r\nHost: t\r\nContent-Length: 100\r\n\r\nabc")
        assert c.wait_closed(timeout=scaled(5)) == b""
    finally:
        c.close()
    wait_until(
        lambda: arena_leases(strict_server) == 0, WAIT_S, "the arena's leases to be released"
    )


def test_idle_keep_alive_is_closed(strict_server: ServerProcess) -> None:
    c = RawClient(strict_server.host, strict_server.port)
    try:
        r = c.request(b"GET /health HTTP/1.1\r\nHost: t\r\n\r\n")
        assert r.status == 200
        assert c.wait_closed(timeout=scaled(5)) == b""
    finally:
        c.close()


def test_max_connections(strict_server: ServerProcess) -> None:
    clients = []
    try:
        # Fill the server (8) while keeping each connection busy with a partial head.
        for _ in range(8):
            c = RawClient(strict_server.host, strict_server.port)
            c.send(b"GET /health HTTP/1.1\r\n")
            clients.append(c)
        extra = RawClient(strict_server.host, strict_server.port)
        clients.append(extra)
        raw = extra.wait_closed(timeout=scaled(5))
        assert read_status(raw) == 503 and b"retry-after" in raw.lower()
    finally:
        for c in clients:
            c.close()


# Connections of the capped server: two idle keep-alive ones and two mid-head.
CAPPED_CONNECTIONS = 4
HEALTH = b"GET /health HTTP/1.1\r\nHost: t\r\n\r\n"
METRICS = b"GET /metrics HTTP/1.1\r\nHost: t\r\n\r\n"


def _metric_of(body: bytes, name: str) -> float:
    for line in body.decode().splitlines():
        if line.startswith(name + " "):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"{name} not exported")


def test_full_server_closes_its_longest_idle_connection_for_a_new_one(loop_name: str) -> None:
    """At max_connections a new client is served: the keep-alive connection idle the
    longest is closed for it (the default keep-alive is long, so idle ones pile up)."""
    server = start_server(
        "--model",
        "echo",
        env={"ZEROSERVE_MAX_CONNECTIONS": str(CAPPED_CONNECTIONS)},
        loop=loop_name,
    )
    clients: list[RawClient] = []

    def connect() -> RawClient:
        clients.append(RawClient(server.host, server.port))
        return clients[-1]

    try:
        oldest, newer = connect(), connect()
        assert oldest.request(HEALTH).status == 200  # idle first
        for _ in range(CAPPED_CONNECTIONS - 2):
            connect().send(b"GET /health HTTP/1.1\r\n")  # busy: a head in progress

        def full() -> bool:  # asked on `newer`, which is then the newest idle one
            r = newer.request(METRICS)
            return _metric_of(r.body, "zeroserve_connections_open") == CAPPED_CONNECTIONS

        wait_until(full, WAIT_S, "every connection slot to be taken")
        late = connect()
        assert late.request(HEALTH).status == 200
        assert oldest.wait_closed(timeout=scaled(5)) == b""
        r = newer.request(METRICS)
        assert r.status == 200
        assert _metric_of(r.body, "zeroserve_connections_evicted_total") == 1
    finally:
        for c in clients:
            c.close()
        assert server.stop() == 0


def test_graceful_shutdown_finishes_in_flight(loop_name: str) -> None:
    server = start_server("--model", "echo", loop=loop_name)
    idle = RawClient(server.host, server.port)
    busy = RawClient(server.host, server.port)
    try:
        assert idle.request(b"GET /health HTTP/1.1\r\nHost: t\r\n\r\n").status == 200
        body = os.urandom(16 << 20)
        busy.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 65536)
        busy._note_request(b"POST /v1/raw/echo HTTP/1.1\r\n")
        busy.send(
            b"POST /v1/raw/echo HTTP/1.1\r\nHost: t\r\nContent-Length: %d\r\n\r\n" % len(body)
            + body
        )
        head = busy.sock.recv(100)  # the response has started; most of it is still queued
        assert head.startswith(b"HTTP/1.1 200")
        busy.conn.receive_data(head)
        server.proc.send_signal(signal.SIGTERM)
        assert idle.wait_closed(timeout=scaled(10)) == b""  # idle keep-alive closed at once
        r = busy.read_response()  # the in-flight response completes
        assert r.status == 200 and r.body == body
        assert server.proc.wait(timeout=scaled(30)) == 0
    finally:
        idle.close()
        busy.close()
        server.stop()


def test_ready_line_names_models(echo_server: ServerProcess) -> None:
    assert echo_server.models == ["echo"]
    assert re.match(r"http://127\.0\.0\.1:\d+", echo_server.url)


def test_refused_requests_give_back_their_admission_ticket(loop_name: str) -> None:
    # queue_depth=2: if a refused request kept its ticket, the third would get 429.
    server = start_server(
        "--model", "emb=tests.support.models.raw:EmbedOnly?queue_depth=2", loop=loop_name
    )
    try:
        with httpx.Client() as client:
            for _ in range(6):
                r = client.post(server.url + "/v1/raw/emb", content=b"x")
                assert r.status_code == 400
                assert r.json()["error"]["code"] == "unsupported_capability"
    finally:
        assert server.stop() == 0


def test_requests_abandoned_at_once_leak_nothing(loop_name: str) -> None:
    # The client sends a whole request and resets the connection at once: the handler's
    # task may be cancelled before its first step. Its lease and ticket must come back.
    server = start_server(
        "--model",
        "rev=tests.support.models.raw:Reverse?executor=thread&queue_depth=4",
        loop=loop_name,
    )
    try:
        body = os.urandom(200_000)
        for _ in range(40):
            c = RawClient(server.host, server.port)
            c.sock.setsockopt(
                socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00"
            )
            c.send(
                b"POST /v1/raw/rev HTTP/1.1\r\nHost: t\r\nContent-Length: %d\r\n\r\n" % len(body)
                + body
            )
            c.close()
        wait_until(lambda: arena_leases(server) == 0, WAIT_S, "the arena's leases to be released")
        # queue_depth=4: leaked tickets would turn these into 429s.
        with httpx.Client() as client:
            for _ in range(8):
                assert client.post(server.url + "/v1/raw/rev", content=b"ab").content == b"ba"
    finally:
        assert server.stop() == 0


def test_sse_pieces_with_line_breaks_become_several_data_lines(loop_name: str) -> None:
    server = start_server("--model", "lines=tests.support.models.raw:Lines", loop=loop_name)
    try:
        r = httpx.post(
            server.url + "/v1/raw/lines", content=b"", headers={"Accept": "text/event-stream"}
        )
        events = r.content.split(b"\n\n")[:-1]
        expected = []
        for i in range(20):
            expected.append(f"data: l{i}\ndata: next" if i % 7 == 3 else f"data: p{i}")
        assert [e.decode() for e in events] == expected
    finally:
        assert server.stop() == 0


def test_early_answer_keeps_the_connection_for_small_bodies(echo_server: ServerProcess) -> None:
    # Answered before its body was read, a small body is read and dropped: the connection
    # stays usable (a client told 429 retries on it instead of reconnecting).
    c = RawClient(echo_server.host, echo_server.port)
    try:
        body = b"z" * 5000
        r = c.request(
            b"POST /v1/raw/missing HTTP/1.1\r\nHost: t\r\nContent-Length: %d\r\n\r\n" % len(body)
            + body
        )
        assert r.status == 404 and "connection" not in r.headers
        r = c.request(b"POST /v1/raw/echo HTTP/1.1\r\nHost: t\r\nContent-Length: 2\r\n\r\nok")
        assert r.status == 200 and r.body == b"ok"
    finally:
        c.close()
