"""Fetching a chat image from a remote URL, guarded (docs/architecture.md, "Images in
chat"; the security page: docs/images.md).

Off unless the operator lists the hosts (``--allow-image-urls``). A URL given by a
client is a request the server makes on its behalf, so each fetch is checked as
hostile input, hop by hop:

* the scheme is ``http`` or ``https``, and the host is one of the listed names
  (exactly; an IP literal only when it is listed itself);
* the host is resolved once, here, and **every** address it resolves to is checked:
  loopback, private, link-local (the cloud metadata address 169.254.169.254 among them),
  multicast, reserved, unspecified and other non-global addresses are refused, and so
  are IPv4 addresses inside IPv6 (mapped, 6to4, Teredo) when the IPv4 one would be;
* the connection goes to the checked address itself (TLS still verifies the host's
  name), so a second DNS lookup cannot swap in another address (DNS rebinding);
* a redirect is a new hop: its URL is checked the same way before it is followed, at
  most ``MAX_REDIRECTS`` times;
* the whole fetch, every hop, runs within one time limit, and the body within a size
  cap (a ``Content-Length`` above it is refused before the body is read).

``allow_loopback`` lets loopback addresses through, for tests that serve images from
127.0.0.1 (``--allow-image-urls-loopback``, documented as unsafe); private, link-local,
metadata, multicast and unspecified addresses stay refused even then.

The response bytes are copied once, into one buffer of the image's size (counted as
``image_fetch``).
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket
import ssl
from dataclasses import dataclass
from urllib.parse import urljoin, urlsplit

from .. import metrics
from ..errors import ProtocolError
from ..http.client import ResponseReader

# Redirects followed per fetch: browsers follow 20, curl 50; an image host needs one or
# two (http -> https, a CDN), and each hop is another request made for a client.
MAX_REDIRECTS = 3
# Seconds one fetch may take in all (every hop, connect to last byte). An image on a CDN
# arrives in well under a second; a slow server must not hold a request for long.
FETCH_TIMEOUT_S = 10.0
# Bytes read from the socket at a time.
READ_BYTES = 64 * 1024
_PORTS = {"http": 80, "https": 443}


class ImageFetchError(Exception):
    """A fetch refused or failed; the message says why without repeating the URL."""


@dataclass(frozen=True, slots=True)
class ImageFetchPolicy:
    """Where images may be fetched from, and the bounds of one fetch.

    ``hosts``: host names (lower case) the server fetches from; ``max_bytes``: the
    largest image; ``timeout_s``: one fetch in all; ``allow_loopback``: loopback
    addresses allowed (tests only: unsafe on any real host)."""

    hosts: frozenset[str]
    max_bytes: int
    timeout_s: float = FETCH_TIMEOUT_S
    allow_loopback: bool = False

    def __post_init__(self) -> None:
        if not self.hosts:
            raise ValueError("an image fetch policy needs at least one host")
        if self.max_bytes < 1 or not self.timeout_s > 0:
            raise ValueError("an image fetch needs a positive size cap and time limit")


def refused_address(
    addr: ipaddress.IPv4Address | ipaddress.IPv6Address, allow_loopback: bool
) -> str | None:
    """Why ``addr`` may not be fetched from, or None when it may."""
    if isinstance(addr, ipaddress.IPv6Address):
        inner = addr.ipv4_mapped or addr.sixtofour or (addr.teredo[1] if addr.teredo else None)
        if inner is not None:
            return refused_address(inner, allow_loopback)
    if addr.is_link_local:
        return "a link-local address (the cloud metadata service among them)"
    if addr.is_multicast:
        return "a multicast address"
    if addr.is_unspecified:
        return "the unspecified address"
    if addr.is_loopback:
        return None if allow_loopback else "a loopback address"
    if addr.is_private:
        return "a private address"
    if addr.is_reserved or not addr.is_global:
        return "a reserved or non-global address"
    return None


async def fetch_image(url: str, policy: ImageFetchPolicy) -> bytearray:
    """The body of ``url``, fetched under ``policy`` (``ImageFetchError`` otherwise)."""
    try:
        async with asyncio.timeout(policy.timeout_s):
            for _ in range(MAX_REDIRECTS + 1):
                status, location, body = await _hop(url, policy)
                if location is None:
                    if status != 200:
                        raise ImageFetchError(f"the image URL answered HTTP {status}")
                    return body
                url = urljoin(url, location)
    except TimeoutError:
        raise ImageFetchError(
            f"the image URL did not answer within {policy.timeout_s:g} s"
        ) from None
    raise ImageFetchError(f"the image URL redirected more than {MAX_REDIRECTS} times")


async def _hop(url: str, policy: ImageFetchPolicy) -> tuple[int, str | None, bytearray]:
    """One request: (status, a redirect's location or None, the body of a 200)."""
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    if scheme not in _PORTS:
        raise ImageFetchError("an image URL must be http or https")
    host = (parts.hostname or "").lower()
    if host not in policy.hosts:
        raise ImageFetchError("the image URL's host is not one this server fetches images from")
    try:
        port = parts.port or _PORTS[scheme]
    except ValueError:
        raise ImageFetchError("the image URL's port is not a number") from None
    ip = await _checked_address(host, port, policy.allow_loopback)
    target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    authority = host if parts.port is None else f"{host}:{port}"
    tls = ssl.create_default_context() if scheme == "https" else None
    try:
        reader, writer = await asyncio.open_connection(
            ip, port, ssl=tls, server_hostname=host if tls is not None else None
        )
    except (OSError, ssl.SSLError) as exc:
        raise ImageFetchError(
            f"cannot connect to the image URL's host ({type(exc).__name__})"
        ) from None
    try:
        writer.write(
            f"GET {target} HTTP/1.1\r\nhost: {authority}\r\nuser-agent: zeroserve\r\n"
            "accept: image/*\r\nconnection: close\r\n\r\n".encode("latin-1")
        )
        return await _response(reader, policy.max_bytes)
    except (OSError, ssl.SSLError, ProtocolError) as exc:
        raise ImageFetchError(f"the image URL's answer broke off ({type(exc).__name__})") from None
    finally:
        writer.close()


async def _checked_address(host: str, port: int, allow_loopback: bool) -> str:
    """The address to connect to: ``host`` resolved once, every address checked."""
    loop = asyncio.get_running_loop()
    try:
        infos = await loop.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except OSError:
        raise ImageFetchError("the image URL's host does not resolve") from None
    addresses = [ipaddress.ip_address(str(info[4][0]).split("%", 1)[0]) for info in infos]
    if not addresses:
        raise ImageFetchError("the image URL's host does not resolve")
    for addr in addresses:
        why = refused_address(addr, allow_loopback)
        if why is not None:
            raise ImageFetchError(
                f"the image URL's host resolves to {why}, which this server never fetches from"
            )
    return str(addresses[0])


async def _response(
    reader: asyncio.StreamReader, max_bytes: int
) -> tuple[int, str | None, bytearray]:
    parser = ResponseReader()
    parser.start("GET")
    body: bytearray | None = None
    size = 0
    while True:
        data = await reader.read(READ_BYTES)
        views = parser.feed(data) if data else []
        head = parser.head
        if head is not None and body is None:
            if 300 <= head.status < 400 and head.header(b"location") is not None:
                location = head.header(b"location") or b""
                return head.status, location.decode("latin-1"), bytearray()
            if head.status != 200:
                return head.status, None, bytearray()
            if head.content_length is not None and head.content_length > max_bytes:
                raise ImageFetchError(f"the image is larger than the limit of {max_bytes} bytes")
            body = bytearray(head.content_length or 0)
        for view in views:
            assert body is not None
            end = size + len(view)
            if end > max_bytes:
                raise ImageFetchError(f"the image is larger than the limit of {max_bytes} bytes")
            body[size:end] = view
            size = end
        if parser.done:
            break
        if not data:
            if not parser.feed_eof():
                raise ImageFetchError("the image URL's answer broke off")
            break
    assert body is not None
    metrics.count_copy("image_fetch", size)
    return 200, None, body
