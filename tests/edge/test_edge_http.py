"""The edge on real sockets with real clients: keys (openai SDK, tritonclient, raw
sockets), quotas on an injected clock, CORS, request ids, TLS and drain."""

from __future__ import annotations

import json
import socket
import ssl
import time
from collections.abc import Iterator

import httpx
import numpy as np
import openai
import pytest
import tritonclient.http as triton
from tritonclient.utils import InferenceServerException

from tests.edge.servers import Certs, LogSink, ManualClock
from tests.server.rawclient import RawClient
from tests.support import ServerThread, scaled
from zeroserve.edge import AccessLog, ApiKey, Edge, EdgeOptions, KeyLimits
from zeroserve.edge.request_id import well_formed
from zeroserve.models.echo import EchoModel
from zeroserve.runtime import ModelConfig
from zeroserve.server.options import ServerOptions, TlsOptions

ALICE = "sk-alice-edge-test-0001"
BOB = "sk-bob-edge-test-0002"
CONFIGS = {"echo": ModelConfig("echo", EchoModel)}
# Polls for a state the server reaches on its own (a lease released after a disconnect).
POLL_TIMEOUT_S = scaled(30.0)


def keys(**alice_limits: int) -> tuple[ApiKey, ...]:
    return (ApiKey("alice", ALICE.encode(), KeyLimits(**alice_limits)), ApiKey("bob", BOB.encode()))


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Certs:
    return Certs(tmp_path_factory.mktemp("tls"))


@pytest.fixture(scope="module")
def log_stream() -> LogSink:
    return LogSink()


@pytest.fixture(scope="module")
def keyed(log_stream: LogSink) -> Iterator[ServerThread]:
    edge = Edge(
        EdgeOptions(keys=keys(), cors_origins=("https://app.example.com",)),
        access_log=AccessLog(stream=log_stream),
    )
    server = ServerThread(CONFIGS, edge=edge).start()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def tls_server(certs: Certs) -> Iterator[ServerThread]:
    options = ServerOptions(
        port=0, head_timeout=1.0, tls=TlsOptions(str(certs.cert), str(certs.key))
    )
    server = ServerThread(CONFIGS, edge=Edge(EdgeOptions(keys=keys())), options=options).start()
    yield server
    server.stop()


def raw(server: ServerThread, request: bytes) -> tuple[int, dict[str, str], bytes]:
    client = RawClient("127.0.0.1", server.port)
    try:
        r = client.request(request)
        return r.status, r.headers, r.body
    finally:
        client.close()


# -- keys -------------------------------------------------------------------------------
@pytest.mark.parametrize("tls", [False, True], ids=["plain", "tls"])
def test_openai_sdk_with_and_without_a_key(
    tls: bool, keyed: ServerThread, tls_server: ServerThread, certs: Certs
) -> None:
    server = tls_server if tls else keyed
    http = certs.httpx() if tls else httpx.Client()
    with http:
        good = server.client(ALICE, http_client=http)
        out = good.completions.create(model="echo", prompt="a b c", max_tokens=3)
        assert out.choices[0].text == "a b c"
        chunks = list(
            good.completions.create(model="echo", prompt="x y", max_tokens=4, stream=True)
        )
        assert "".join(c.choices[0].text for c in chunks if c.choices) == "x y x y"
        no_key = http.get(server.url + "/v1/models")
        assert no_key.status_code == 401 and no_key.json()["error"]["code"] == "invalid_api_key"
        assert no_key.headers["www-authenticate"].startswith("Bearer")
        for bad in ("sk-wrong", ALICE + "x"):
            client = server.client(bad, http_client=http)
            with pytest.raises(openai.AuthenticationError) as info:
                client.models.list()
            resp = info.value.response
            assert resp.status_code == 401
            assert resp.headers["www-authenticate"].startswith("Bearer")
            err = resp.json()["error"]
            assert err["code"] == "invalid_api_key" and err["type"] == "invalid_request_error"
            assert resp.headers["x-request-id"] in err["message"]
            assert "sk-" not in resp.text


def test_401_is_answered_before_the_body(keyed: ServerThread) -> None:
    # A 16 MiB Content-Length with no body sent: the 401 comes at once, from the head.
    status, headers, body = raw(
        keyed,
        b"POST /v1/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
        b"content-length: 16777216\r\n\r\n",
    )
    assert status == 401 and json.loads(body)["error"]["code"] == "invalid_api_key"
    assert headers["connection"] == "close"


def test_kserve_401_in_its_own_format_and_tritonclient_with_a_header(keyed: ServerThread) -> None:
    status, _, body = raw(keyed, b"GET /v2/models/echo HTTP/1.1\r\nhost: x\r\n\r\n")
    assert status == 401 and list(json.loads(body)) == ["error"]
    client = triton.InferenceServerClient(f"127.0.0.1:{keyed.port}")
    try:
        with pytest.raises(InferenceServerException):
            client.get_model_metadata("echo")
        auth = {"authorization": f"Bearer {BOB}"}
        assert client.get_model_metadata("echo", headers=auth)["name"] == "echo"
        data = np.arange(6, dtype=np.float32).reshape(2, 3)
        inp = triton.InferInput("INPUT0", list(data.shape), "FP32")
        inp.set_data_from_numpy(data, binary_data=True)
        result = client.infer("echo", [inp], headers={"x-api-key": ALICE})
        np.testing.assert_array_equal(result.as_numpy("INPUT0"), data)
    finally:
        client.close()


@pytest.mark.parametrize(
    "value",
    [
        b"Bearer",
        b"Bearer ",
        b"Basic YWxpY2U6cHc=",
        b"\xff\xfe\xfd",
        b"Bearer " + b"k" * 4000,
        b"bearer\tsk-x",
        b"Token " + ALICE.encode(),
    ],
)
def test_malformed_authorization_is_401_never_500(keyed: ServerThread, value: bytes) -> None:
    status, _, body = raw(
        keyed, b"GET /v1/models HTTP/1.1\r\nhost: x\r\nauthorization: " + value + b"\r\n\r\n"
    )
    assert status == 401, body
    assert json.loads(body)["error"]["code"] == "invalid_api_key"


def test_a_key_in_the_query_is_refused(keyed: ServerThread) -> None:
    r = httpx.get(keyed.url + f"/v1/models?api_key={ALICE}", headers={"x-api-key": ALICE})
    assert r.status_code == 401 and ALICE not in r.text
    assert httpx.get(keyed.url + "/v1/models", headers={"api-key": ALICE}).status_code == 200


def test_probes_and_metrics_stay_open(keyed: ServerThread) -> None:
    for path in ("/health", "/ready", "/metrics", "/v2/health/ready"):
        assert httpx.get(keyed.url + path).status_code == 200, path


# -- request ids ------------------------------------------------------------------------
def test_request_ids_are_kept_when_well_formed_and_replaced_otherwise(keyed: ServerThread) -> None:
    r = httpx.get(keyed.url + "/health", headers={"x-request-id": "abc-123"})
    assert r.headers["x-request-id"] == "abc-123"
    fresh = {httpx.get(keyed.url + "/health").headers["x-request-id"] for _ in range(3)}
    assert len(fresh) == 3 and all(well_formed(i.encode()) for i in fresh)
    for bad in (b"x" * 10240, b"id\x01\x02", b"id\x1b[2J"):
        status, headers, _ = raw(
            keyed, b"GET /health HTTP/1.1\r\nhost: x\r\nx-request-id: " + bad + b"\r\n\r\n"
        )
        got = headers.get("x-request-id", "").encode()
        assert got != bad and well_formed(got), status


# Records a flooding TLS client sends (64 x 16 KiB, 1 MiB): far more than a handshake.
TLS_FLOOD_RECORDS = 64


# -- CORS -------------------------------------------------------------------------------
def preflight(server: ServerThread, origin: str) -> httpx.Response:
    return httpx.options(
        server.url + "/v1/chat/completions",
        headers={
            "origin": origin,
            "access-control-request-method": "POST",
            "access-control-request-headers": "authorization, content-type",
        },
    )


def test_preflight_from_a_listed_origin_is_answered_at_the_head(keyed: ServerThread) -> None:
    r = preflight(keyed, "https://app.example.com")  # no key: preflights carry none
    assert r.status_code == 204 and r.content == b""
    assert "content-length" not in r.headers  # RFC 9110: a 204 has none
    assert r.headers["access-control-allow-origin"] == "https://app.example.com"
    assert "POST" in r.headers["access-control-allow-methods"]
    assert "authorization" in r.headers["access-control-allow-headers"]
    actual = httpx.get(
        keyed.url + "/v1/models",
        headers={"origin": "https://app.example.com", "authorization": f"Bearer {ALICE}"},
    )
    assert actual.headers["access-control-allow-origin"] == "https://app.example.com"
    assert "x-request-id" in actual.headers["access-control-expose-headers"]


def test_a_preflight_keeps_its_connection_for_the_actual_request(keyed: ServerThread) -> None:
    """A 204 has no body and no Content-Length, so the connection stays usable."""
    ports: set[int] = set()

    def record(response: httpx.Response) -> None:
        stream = response.extensions["network_stream"]
        ports.add(stream.get_extra_info("socket").getsockname()[1])

    with httpx.Client(base_url=keyed.url, event_hooks={"response": [record]}) as client:
        origin = {"origin": "https://app.example.com"}
        r = client.options("/v1/models", headers={**origin, "access-control-request-method": "GET"})
        assert r.status_code == 204
        r = client.get("/v1/models", headers={**origin, "authorization": f"Bearer {ALICE}"})
        assert r.status_code == 200
        assert r.headers["access-control-allow-origin"] == "https://app.example.com"
    assert len(ports) == 1


def test_preflight_from_another_origin_gets_no_allow_headers(keyed: ServerThread) -> None:
    r = preflight(keyed, "https://evil.example.com")
    assert r.status_code == 204  # answered, but the browser is not allowed anything
    assert not [h for h in r.headers if h.startswith("access-control-")]
    r = httpx.get(keyed.url + "/health", headers={"origin": "https://evil.example.com"})
    assert not [h for h in r.headers if h.startswith("access-control-")]


def test_cors_is_off_by_default() -> None:
    server = ServerThread(CONFIGS, edge=Edge()).start()
    try:
        r = httpx.get(server.url + "/health", headers={"origin": "https://app.example.com"})
        assert not [h for h in r.headers if h.startswith("access-control-")]
        assert preflight(server, "https://app.example.com").status_code == 405
    finally:
        server.stop()


# -- quotas on an injected clock -------------------------------------------------------------
def quota_server(clock: ManualClock, **limits: int) -> ServerThread:
    return ServerThread(CONFIGS, edge=Edge(EdgeOptions(keys=keys(**limits)), clock=clock)).start()


def test_requests_per_minute_429_with_retry_after_and_headers() -> None:
    clock = ManualClock()
    server = quota_server(clock, requests_per_minute=2)
    try:
        client = server.client(ALICE)
        for _ in range(2):
            client.models.list()
        with pytest.raises(openai.RateLimitError) as info:
            client.models.list()
        h = info.value.response.headers
        assert (h["retry-after"], h["retry-after-ms"]) == ("30", "30000")  # 2/min: one per 30 s
        assert h["x-ratelimit-limit-requests"] == "2"
        assert h["x-ratelimit-remaining-requests"] == "0"
        assert h["x-ratelimit-reset-requests"] == "1m0s"
        assert info.value.response.json()["error"]["code"] == "rate_limit_exceeded"
        server.client(BOB).models.list()  # another key has its own quota
        clock.now += 30
        r = client.models.with_raw_response.list()
        assert r.headers["x-ratelimit-remaining-requests"] == "0"
    finally:
        server.stop()


def test_tokens_per_minute_are_debited_by_streams() -> None:
    clock = ManualClock()
    server = quota_server(clock, tokens_per_minute=60)  # one token per second
    try:
        client = server.client(ALICE)
        # A 2-token prompt and 100 streamed tokens: 102 spent of 60.
        stream = client.completions.create(model="echo", prompt="a b", max_tokens=100, stream=True)
        assert sum(1 for c in stream if c.choices and c.choices[0].text) >= 1
        with pytest.raises(openai.RateLimitError) as info:
            client.completions.create(model="echo", prompt="a", max_tokens=1)
        h = info.value.response.headers
        assert h["retry-after-ms"] == "43000"  # 42 in debt + 1 to admit, at 1 token/s
        assert h["x-ratelimit-limit-tokens"] == "60"
        assert h["x-ratelimit-remaining-tokens"] == "0"
        clock.now += 43
        assert client.completions.create(model="echo", prompt="a", max_tokens=1).choices
    finally:
        server.stop()


def test_tokens_per_minute_are_debited_by_raw_streams() -> None:
    """A raw stream's pieces are its tokens (``max_tokens`` bounds them): a key's token
    quota cannot be bypassed through ``/v1/raw``."""
    clock = ManualClock()
    server = quota_server(clock, tokens_per_minute=60)
    try:
        auth = {"authorization": f"Bearer {ALICE}"}
        url = server.url + "/v1/raw/echo?stream=1&max_tokens=100"
        r = httpx.post(url, content=b"a b", headers=auth)
        assert r.status_code == 200 and r.content == b"ab" * 50  # 100 pieces: 100 of 60
        refused = httpx.post(url, content=b"a", headers=auth)
        assert refused.status_code == 429
        assert refused.headers["retry-after-ms"] == "41000"  # 40 in debt + 1, at 1 token/s
        assert refused.headers["x-ratelimit-remaining-tokens"] == "0"
    finally:
        server.stop()


def test_concurrency_429_until_the_stream_ends() -> None:
    clock = ManualClock()
    server = quota_server(clock, max_concurrent=1)
    try:
        body = {"model": "echo", "prompt": "t", "max_tokens": 1_000_000, "stream": True}
        auth = {"authorization": f"Bearer {ALICE}"}
        with (
            httpx.Client() as http,
            http.stream("POST", server.url + "/v1/completions", json=body, headers=auth) as r,
        ):
            assert r.status_code == 200
            chunks = r.iter_bytes()  # kept: dropping the iterator closes the response
            next(chunks)  # the stream is running
            second = httpx.get(server.url + "/v1/models", headers=auth)
            assert second.status_code == 429
            assert second.headers["retry-after"] == "1"
            assert "1 requests in flight" in second.json()["error"]["message"]
        deadline = time.monotonic() + POLL_TIMEOUT_S
        while httpx.get(server.url + "/v1/models", headers=auth).status_code == 429:
            assert time.monotonic() < deadline, "the stream's slot was never released"
    finally:
        server.stop()


# -- access log -------------------------------------------------------------------------------
def test_access_log_has_one_line_per_request_and_never_a_key(
    keyed: ServerThread, log_stream: LogSink
) -> None:
    client = keyed.client(BOB)
    list(
        client.completions.create(
            model="echo",
            prompt="p q",
            max_tokens=5,
            stream=True,
            extra_headers={"x-request-id": "stream-1"},
        )
    )
    with pytest.raises(openai.AuthenticationError):
        keyed.client("sk-intruder-999").models.list()
    text = log_stream.wait_for_text(b'"stream-1"')  # written by the log's thread
    for secret in (ALICE, BOB, "sk-intruder-999", "sk-wrong"):
        assert secret.encode() not in text
    lines = [json.loads(x) for x in text.splitlines()]
    rec = next(x for x in lines if x["request_id"] == "stream-1")
    assert rec["key"] == "bob" and rec["model"] == "echo" and rec["status"] == 200
    assert rec["outcome"] == "done" and rec["tokens"] == 7  # 2 prompt + 5 completion
    assert rec["ttft_s"] >= 0 and rec["bytes_out"] > 0 and rec["bytes_in"] > 0
    assert any(x["status"] == 401 and x["outcome"] == "rejected" and "key" not in x for x in lines)


def test_access_log_counts_a_raw_streams_pieces_as_tokens(
    keyed: ServerThread, log_stream: LogSink
) -> None:
    ids = {"*/*": "raw-chunked-1", "text/event-stream": "raw-sse-1"}
    for accept, request_id in ids.items():
        r = httpx.post(
            keyed.url + "/v1/raw/echo?stream=1&max_tokens=9",
            content=b"x y z",
            headers={
                "authorization": f"Bearer {BOB}",
                "x-request-id": request_id,
                "accept": accept,
            },
        )
        assert r.status_code == 200
    for request_id in ids.values():
        text = log_stream.wait_for_text(f'"{request_id}"'.encode())
        rec = next(json.loads(x) for x in text.splitlines() if request_id.encode() in x)
        assert (rec["tokens"], rec["outcome"], rec["model"], rec["key"]) == (
            9,
            "done",
            "echo",
            "bob",
        )


def test_a_client_that_leaves_mid_stream_is_logged_as_gone(
    keyed: ServerThread, log_stream: LogSink
) -> None:
    body = {"model": "echo", "prompt": "z", "max_tokens": 1_000_000, "stream": True}
    headers = {"authorization": f"Bearer {ALICE}", "x-request-id": "leaver-1"}
    with (
        httpx.Client() as http,
        http.stream("POST", keyed.url + "/v1/completions", json=body, headers=headers) as r,
    ):
        chunks = r.iter_bytes()
        next(chunks)
    text = log_stream.wait_for_text(b'"leaver-1"')  # written once the server sees it
    rec = next(json.loads(x) for x in text.splitlines() if b'"leaver-1"' in x)
    assert rec["outcome"] == "client_gone" and rec["key"] == "alice" and rec["status"] == 200
    assert rec["tokens"] >= 2 and rec["bytes_out"] > 0


# -- TLS --------------------------------------------------------------------------------------
def test_tls_counts_copies_and_speaks_http11(tls_server: ServerThread, certs: Certs) -> None:
    ctx = certs.client_context()
    ctx.set_alpn_protocols(["http/1.1"])
    with (
        socket.create_connection(("127.0.0.1", tls_server.port), timeout=scaled(10)) as s,
        ctx.wrap_socket(s, server_hostname="127.0.0.1") as tls,
    ):
        assert tls.selected_alpn_protocol() == "http/1.1"
    with certs.httpx() as http:
        before = _metric(
            http.get(tls_server.url + "/metrics").text, 'zeroserve_copied_bytes_total{site="tls"}'
        )
        r = http.post(
            tls_server.url + "/v1/raw/echo", content=b"z" * 5000, headers={"x-api-key": BOB}
        )
        assert r.content == b"z" * 5000
        after = _metric(
            http.get(tls_server.url + "/metrics").text, 'zeroserve_copied_bytes_total{site="tls"}'
        )
    assert after - before >= 5000


@pytest.mark.parametrize(
    "send",
    [
        b"",
        b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03",
        b"GET /health HTTP/1.1\r\nhost: x\r\n\r\n",
    ],
    ids=["silent", "half-handshake", "plain-http"],
)
def test_bad_tls_clients_are_closed_and_the_server_keeps_serving(
    tls_server: ServerThread, certs: Certs, send: bytes
) -> None:
    # head_timeout is 1 s; the socket timeout only bounds a failure of this test.
    with socket.create_connection(("127.0.0.1", tls_server.port), timeout=POLL_TIMEOUT_S) as s:
        s.sendall(send)
        data = b""
        try:
            while chunk := s.recv(4096):
                data += chunk
        except ConnectionResetError:
            pass
        assert b"HTTP/1.1 200" not in data
    with certs.httpx() as http:
        assert http.get(tls_server.url + "/health").status_code == 200


def test_a_flood_of_tls_records_is_closed_and_the_server_keeps_serving(
    tls_server: ServerThread, certs: Certs
) -> None:
    """Application-data records before any handshake: the TLS layer refuses them and the
    connection is closed; the flood never reaches the HTTP parser."""
    record = b"\x17\x03\x03\x40\x00" + bytes(0x4000)  # 16 KiB records
    with socket.create_connection(("127.0.0.1", tls_server.port), timeout=POLL_TIMEOUT_S) as s:
        data = b""
        try:
            for _ in range(TLS_FLOOD_RECORDS):
                s.sendall(record)
            while chunk := s.recv(4096):
                data += chunk
        except (ConnectionResetError, BrokenPipeError):
            pass  # closed while the flood was still being sent: what is wanted
        assert b"HTTP/1.1" not in data
    with certs.httpx() as http:
        assert http.get(tls_server.url + "/health").status_code == 200


def test_mtls_requires_a_client_certificate(certs: Certs) -> None:
    options = ServerOptions(
        port=0,
        head_timeout=1.0,
        tls=TlsOptions(str(certs.cert), str(certs.key), ca_certs=str(certs.cert)),
    )
    server = ServerThread(CONFIGS, edge=Edge(), options=options).start()
    try:
        refused = (httpx.ReadError, httpx.ConnectError, httpx.RemoteProtocolError, ssl.SSLError)
        with certs.httpx() as http, pytest.raises(refused):
            http.get(server.url + "/health")
        ctx = certs.client_context()
        ctx.load_cert_chain(str(certs.cert), str(certs.key))  # self-signed: its own CA
        with httpx.Client(verify=ctx) as http:
            assert http.get(server.url + "/health").status_code == 200
    finally:
        server.stop()


# -- drain ------------------------------------------------------------------------------------
def test_ready_is_503_while_a_long_stream_finishes() -> None:
    options = ServerOptions(port=0, drain_ready_delay=300.0)
    server = ServerThread(CONFIGS, edge=Edge(), options=options).start()
    assert server.server is not None
    try:
        assert httpx.get(server.url + "/ready").status_code == 200
        body = {"model": "echo", "prompt": "w", "max_tokens": 2000, "stream": True}
        with (
            httpx.Client() as http,
            http.stream("POST", server.url + "/v1/completions", json=body) as r,
        ):
            it = r.iter_lines()
            assert next(it).startswith("data: ")
            server.call_soon(server.server.request_shutdown)
            deadline = time.monotonic() + POLL_TIMEOUT_S
            while (ready := httpx.get(server.url + "/ready")).status_code == 200:
                assert time.monotonic() < deadline
            assert ready.status_code == 503 and ready.json()["status"] == "draining"
            assert ready.headers["connection"] == "close"
            lines = [x for x in it if x]
        assert lines[-1] == "data: [DONE]"
        # The 1999 pieces after the first, then the chunk with the finish reason.
        assert sum(1 for x in lines if x.startswith("data: {")) == 2000
    finally:
        server.stop()


def _metric(text: str, name: str) -> float:
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.rsplit(" ", 1)[1])
    return 0.0
