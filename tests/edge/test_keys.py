"""API keys: where the credential is read from, constant-time matching, the keys file.
A request's credential is checked as the server checks it: ``Edge.start`` reads the
headers once, ``Edge.admit`` matches the key."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from zeroserve.edge import ApiKey, Edge, EdgeOptions, KeyLimits, KeyRing, load_keys_file
from zeroserve.errors import Unauthorized

ALICE = ApiKey("alice", b"sk-alice-0123456789")
BOB = ApiKey("bob", b"sk-bob-9876543210", KeyLimits(max_concurrent=2))
RING = KeyRing([ALICE, BOB])
PATH = "/v1/chat/completions"

Headers = list[tuple[bytes, bytes]]


@pytest.fixture(scope="module")
def edge() -> Iterator[Edge]:
    e = Edge(EdgeOptions(keys=(ALICE, BOB)))
    yield e
    e.close()


def authenticate(edge: Edge, headers: Headers, query: str = "") -> ApiKey | None:
    """The key the edge admits a request with these headers (and query) under."""
    ctx = edge.start("POST", headers, PATH)
    edge.admit(ctx, PATH, query)
    edge.release_quota(ctx)
    return ctx.key


@pytest.mark.parametrize(
    "headers",
    [
        [(b"authorization", b"Bearer sk-bob-9876543210")],
        [(b"authorization", b"bearer   sk-bob-9876543210  ")],
        [(b"authorization", b"BEARER sk-bob-9876543210")],
        [(b"api-key", b"sk-bob-9876543210")],
        [(b"x-api-key", b"sk-bob-9876543210")],
    ],
)
def test_each_header_form_finds_the_key(edge: Edge, headers: Headers) -> None:
    assert authenticate(edge, [(b"host", b"x"), *headers]) is BOB


@pytest.mark.parametrize(
    "headers",
    [
        [],
        [(b"authorization", b"Bearer sk-nobody")],
        [(b"authorization", b"Basic c2stYWxpY2U6")],
        [(b"authorization", b"Bearer")],
        [(b"authorization", b"Bearer ")],
        [(b"authorization", b"sk-alice-0123456789")],
        [(b"authorization", b"\x00\xff")],
        [(b"authorization", b"Bearer " + b"A" * 10_000)],
        [(b"x-api-key", b"")],
        [(b"api-key", b"sk-alice-012345678")],  # a prefix of a real key
    ],
)
def test_missing_malformed_or_unknown_credentials_are_401(edge: Edge, headers: Headers) -> None:
    with pytest.raises(Unauthorized) as info:
        authenticate(edge, headers)
    exc = info.value
    assert exc.status == 401 and exc.code == "invalid_api_key"
    assert (b"www-authenticate", b'Bearer realm="zeroserve"') in exc.headers
    assert b"sk-" not in exc.message.encode()


def test_the_sdk_form_finds_every_key_of_the_ring(edge: Edge) -> None:
    # "Bearer KEY" is compared whole with each key's; the first and the last key both match.
    for key in (ALICE, BOB):
        assert authenticate(edge, [(b"authorization", b"Bearer " + key.secret)]) is key
        assert authenticate(edge, [(b"authorization", b"Bearer  " + key.secret)]) is key


def test_the_ring_refuses_a_secret_no_header_can_carry() -> None:
    for secret in (b" sk-lead", b"sk-trail ", b"sk in", b"sk-\x7f"):
        with pytest.raises(ValueError, match="visible ASCII"):
            KeyRing([ApiKey("x", secret)])


def test_authorization_wins_over_the_other_headers(edge: Edge) -> None:
    headers = [(b"x-api-key", b"sk-alice-0123456789"), (b"authorization", b"Bearer sk-wrong")]
    with pytest.raises(Unauthorized):
        authenticate(edge, headers)


@pytest.mark.parametrize("query", ["api_key=sk-alice-0123456789", "a=1&key=x", "ACCESS_TOKEN=t"])
def test_a_key_in_the_query_is_refused_even_with_a_good_header(edge: Edge, query: str) -> None:
    with pytest.raises(Unauthorized, match="not accepted in the URL"):
        authenticate(edge, [(b"authorization", b"Bearer sk-alice-0123456789")], query)


def test_an_unrelated_query_is_fine(edge: Edge) -> None:
    assert authenticate(edge, [(b"api-key", b"sk-alice-0123456789")], "stream=true") is ALICE


def test_repr_never_shows_the_secret() -> None:
    assert "sk-alice" not in repr(ALICE) and "alice" in repr(ALICE)
    assert "sk-" not in repr(RING.key("bob"))


def test_the_ring_refuses_duplicates() -> None:
    with pytest.raises(ValueError, match="unique"):
        KeyRing([ALICE, ApiKey("alice", b"other")])
    with pytest.raises(ValueError, match="same secret"):
        KeyRing([ALICE, ApiKey("carol", ALICE.secret)])


def test_keys_file(tmp_path: Path) -> None:
    path = tmp_path / "keys.toml"
    path.write_text(
        '[keys.alice]\nkey = "sk-alice-1"\nmax_concurrent = 4\nrequests_per_minute = 600\n'
        'tokens_per_minute = 100000\n\n[keys.ci]\nkey = "sk-ci-2"\n'
    )
    alice, ci = load_keys_file(str(path))
    assert alice.name == "alice" and alice.secret == b"sk-alice-1"
    assert alice.limits == KeyLimits(4, 600, 100000)
    assert ci.limits == KeyLimits() and not ci.limits.limited


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('[keys.a]\nkey = "k"\nmax_concurent = 2\n', "unknown field"),
        ("[keys.a]\nmax_concurrent = 2\n", "'key' must be"),
        ('[keys.a]\nkey = "k"\nrequests_per_minute = 0\n', "positive integer"),
        ('[keys.a]\nkey = "k"\ntokens_per_minute = true\n', "positive integer"),
        ('[key.a]\nkey = "k"\n', "unknown top-level"),
        ('[keys.a]\nkey = "k\u00e9"\n', "ASCII"),
        ("[keys.a\n", "not valid TOML"),
    ],
)
def test_bad_keys_files_name_the_fault_never_the_secret(
    tmp_path: Path, text: str, message: str
) -> None:
    path = tmp_path / "keys.toml"
    path.write_text(text)
    with pytest.raises(ValueError, match=message) as info:
        load_keys_file(str(path))
    assert '"k"' not in str(info.value)
