"""CORS decisions and request ids, from header values alone."""

from __future__ import annotations

import pytest

from zeroserve.edge import CorsPolicy, RequestIds
from zeroserve.edge.cors import is_preflight
from zeroserve.edge.request_id import MAX_REQUEST_ID_BYTES, well_formed

APP = b"https://app.example.com"


def test_listed_origin_is_reflected_with_vary() -> None:
    cors = CorsPolicy(["https://app.example.com"], allow_credentials=True)
    h = dict(cors.simple(APP))
    assert h[b"access-control-allow-origin"] == APP
    assert h[b"vary"] == b"origin"
    assert h[b"access-control-allow-credentials"] == b"true"
    assert b"x-request-id" in h[b"access-control-expose-headers"]
    pre = dict(cors.preflight(APP))
    assert b"POST" in pre[b"access-control-allow-methods"]
    assert b"authorization" in pre[b"access-control-allow-headers"]


@pytest.mark.parametrize(
    "origin", [b"https://evil.example.com", b"http://app.example.com", b"null", b""]
)
def test_unlisted_origin_gets_no_allow_headers(origin: bytes) -> None:
    cors = CorsPolicy(["https://app.example.com"])
    for headers in (cors.simple(origin), cors.preflight(origin)):
        assert not [n for n, _ in headers if n.startswith(b"access-control-")]


def test_wildcard_never_reflects_and_never_with_credentials() -> None:
    cors = CorsPolicy(["*"])
    assert dict(cors.simple(b"https://any.example"))[b"access-control-allow-origin"] == b"*"
    assert b"access-control-allow-credentials" not in dict(cors.preflight(b"https://any.example"))
    with pytest.raises(ValueError, match="credentials"):
        CorsPolicy(["*"], allow_credentials=True)
    with pytest.raises(ValueError, match="not an origin"):
        CorsPolicy(["app.example.com"])


def test_preflight_is_options_with_a_requested_method() -> None:
    assert is_preflight("OPTIONS", [(b"access-control-request-method", b"POST")])
    assert not is_preflight("OPTIONS", [])
    assert not is_preflight("POST", [(b"access-control-request-method", b"POST")])


def test_well_formed_client_ids_are_kept() -> None:
    ids = RequestIds(prefix=b"p")
    for value in (b"abc-123", b"9f1c2e4a-7d3b-4f5e-8a1b-2c3d4e5f6a7b", b"a" * MAX_REQUEST_ID_BYTES):
        assert ids.take(value) == value


@pytest.mark.parametrize(
    "value",
    [
        b"x" * 10240,
        b"a" * (MAX_REQUEST_ID_BYTES + 1),
        b"id\x00",
        b"id\r\nx-evil: 1",
        b"id\x1b[31m",
        b"",
        b'"quoted"',
        b"sp ace",
        "\u00e9t\u00e9".encode(),
    ],
)
def test_malformed_ids_are_replaced(value: bytes) -> None:
    ids = RequestIds(prefix=b"p")
    got = ids.take(value)
    assert got != value and well_formed(got) and got.startswith(b"p-")


def test_new_ids_are_unique_and_prefixed_per_process() -> None:
    a, b = RequestIds(), RequestIds()
    made = {a.new() for _ in range(1000)} | {b.new() for _ in range(1000)}
    assert len(made) == 2000
    assert all(well_formed(i) for i in made)
