"""The guard in front of remote chat images (``upstream/image_fetch.py``, docs/images.md):
real fetches over loopback sockets from a small HTTP server that serves an image,
redirects where an attacker would (the cloud metadata address, a private address,
``0.0.0.0``, a host not listed), answers too much, or never answers.

Loopback is reachable here only because each test that fetches says so
(``allow_loopback``, the ``--allow-image-urls-loopback`` flag); without it the same
fetch is refused.
"""

from __future__ import annotations

import asyncio
import ipaddress
from collections.abc import Iterator

import pytest

from tests.support import scaled
from tests.support.image_server import CAP, IMAGE, serve_images
from zeroserve.upstream.image_fetch import (
    MAX_REDIRECTS,
    ImageFetchError,
    ImageFetchPolicy,
    fetch_image,
    refused_address,
)


@pytest.fixture(scope="module")
def images() -> Iterator[str]:
    with serve_images() as url:
        yield url


HOSTS = frozenset({"127.0.0.1", "169.254.169.254", "10.0.0.1", "0.0.0.0"})
LOOPBACK = ImageFetchPolicy(HOSTS, max_bytes=CAP, timeout_s=scaled(10.0), allow_loopback=True)


def fetch(url: str, policy: ImageFetchPolicy = LOOPBACK) -> bytes:
    return bytes(asyncio.run(fetch_image(url, policy)))


def refusal(url: str, policy: ImageFetchPolicy = LOOPBACK) -> str:
    with pytest.raises(ImageFetchError) as info:
        fetch(url, policy)
    return str(info.value)


@pytest.mark.parametrize(
    ("address", "why"),
    [
        ("169.254.169.254", "link-local"),
        ("fe80::1", "link-local"),
        ("127.0.0.1", "loopback"),
        ("::1", "loopback"),
        ("::ffff:127.0.0.1", "loopback"),
        ("::ffff:169.254.169.254", "link-local"),
        ("10.0.0.1", "private"),
        ("192.168.1.1", "private"),
        ("172.16.0.1", "private"),
        ("fd00::1", "private"),
        ("100.64.0.1", "non-global"),
        ("0.0.0.0", "unspecified"),
        ("224.0.0.1", "multicast"),
        ("240.0.0.1", "private"),  # reserved; Python lists 240.0.0.0/4 as private
        ("2002:7f00:1::", "loopback"),  # 6to4 around 127.0.0.1
    ],
)
def test_addresses_that_are_never_fetched(address: str, why: str) -> None:
    reason = refused_address(ipaddress.ip_address(address), allow_loopback=False)
    assert reason is not None and why in reason


@pytest.mark.parametrize("address", ["93.184.216.34", "2606:4700::1111"])
def test_global_addresses_are_fetched(address: str) -> None:
    assert refused_address(ipaddress.ip_address(address), allow_loopback=False) is None


def test_the_loopback_override_lets_loopback_alone_through() -> None:
    assert refused_address(ipaddress.ip_address("127.0.0.1"), allow_loopback=True) is None
    for other in ("10.0.0.1", "169.254.169.254", "0.0.0.0"):
        assert refused_address(ipaddress.ip_address(other), allow_loopback=True) is not None


def test_an_allowed_image_is_fetched(images: str) -> None:
    assert fetch(images + "/cat.png") == IMAGE
    assert fetch(images + "/to-image") == IMAGE  # a redirect within the listed host


def test_loopback_is_refused_without_the_override(images: str) -> None:
    policy = ImageFetchPolicy(HOSTS, max_bytes=CAP)
    assert "loopback" in refusal(images + "/cat.png", policy)


@pytest.mark.parametrize(
    ("path", "why"),
    [
        ("/to-metadata", "link-local"),
        ("/to-private", "private"),
        ("/to-zero", "unspecified"),
        ("/to-unlisted", "not one this server fetches images from"),
    ],
)
def test_redirects_are_checked_like_the_first_url(images: str, path: str, why: str) -> None:
    assert why in refusal(images + path)


def test_redirects_are_bounded(images: str) -> None:
    assert f"more than {MAX_REDIRECTS}" in refusal(images + "/loop")


def test_a_host_not_listed_is_refused(images: str) -> None:
    policy = ImageFetchPolicy(frozenset({"images.example"}), max_bytes=CAP, allow_loopback=True)
    assert "not one this server fetches images from" in refusal(images + "/cat.png", policy)


def test_only_http_and_https(images: str) -> None:
    assert "http or https" in refusal("file:///etc/passwd")
    assert "http or https" in refusal("gopher://127.0.0.1/")


def test_oversize_is_refused(images: str) -> None:
    assert "larger than the limit" in refusal(images + "/big")
    assert "larger than the limit" in refusal(images + "/big-unannounced")


def test_a_slow_server_meets_the_time_limit(images: str) -> None:
    policy = ImageFetchPolicy(HOSTS, max_bytes=CAP, timeout_s=0.2, allow_loopback=True)
    assert "did not answer within" in refusal(images + "/slow", policy)


def test_an_error_status_is_refused(images: str) -> None:
    assert "HTTP 404" in refusal(images + "/missing.png")


def test_a_policy_needs_hosts() -> None:
    with pytest.raises(ValueError):
        ImageFetchPolicy(frozenset(), max_bytes=CAP)


def test_the_configuration_builds_the_policy() -> None:
    from zeroserve.config import load_config
    from zeroserve.errors import ConfigError

    assert load_config(env={}).image_fetch() is None  # off by default
    cfg = load_config(
        env={
            "ZEROSERVE_IMAGES__ALLOW_URLS": "Images.Example,cdn.example",
            "ZEROSERVE_API_LIMITS__IMAGE_BYTES": "1000",
        }
    )
    policy = cfg.image_fetch()
    assert policy is not None
    assert policy.hosts == {"images.example", "cdn.example"}
    assert policy.max_bytes == 1000 and not policy.allow_loopback
    flags = load_config(
        env={}, overrides={"images": {"allow_urls": ["127.0.0.1"], "allow_loopback_urls": True}}
    )
    assert flags.image_fetch() == ImageFetchPolicy(
        frozenset({"127.0.0.1"}), max_bytes=20 * 1024 * 1024, allow_loopback=True
    )
    with pytest.raises(ConfigError, match="images"):
        load_config(env={}, overrides={"images": {"allow_urls": ["x"], "fetch_timeout_s": 0}})
