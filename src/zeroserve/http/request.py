"""One request head: parsed by httptools (llhttp), then validated by our rules.

Invariants
----------
* No request is processed with an ambiguous length (RFC 9112 §6.3): both Content-Length
  and Transfer-Encoding, duplicate Content-Length, a transfer coding other than a single
  final ``chunked``, or Transfer-Encoding in HTTP/1.0 are 400.
* HTTP/1.1 needs exactly one valid Host; the target and header counts are bounded by
  ``HttpLimits`` (414, 431); a Content-Length over the body limit is 413 before any body
  byte is read.
"""

from __future__ import annotations

import re
from typing import Final
from urllib.parse import unquote

import httptools

from ..errors import ProtocolError
from .limits import HttpLimits

__all__ = ["HeadCollector", "RequestHead", "parse_head", "split_target"]


class RequestHead:
    """A parsed request head. Read-only: what the connection decides from it (keep-alive,
    framing) cannot be changed behind its back. Its attributes are ``Final``, which mypy
    checks everywhere and the compiled build enforces at run time (AttributeError).

    A plain class, so that the compiled build makes it native: compiled code then reads a
    field as a struct load. It was a ``msgspec.Struct`` (the fastest to build in the
    interpreter), whose fields compiled code can only read by Python's generic
    ``getattr``, about 190 instructions each and some twenty reads a request
    (docs/decisions/0008-types-decide-the-calls.md)."""

    __slots__ = (
        "chunked",
        "content_length",
        "expect_continue",
        "head_bytes",
        "headers",
        "keep_alive",
        "method",
        "path",
        "query",
        "target",
        "version",
    )

    def __init__(
        self,
        *,
        method: str,
        target: bytes,
        path: str,
        query: str,
        version: str,
        headers: list[tuple[bytes, bytes]],
        content_length: int | None,
        chunked: bool,
        keep_alive: bool,
        expect_continue: bool,
        head_bytes: int,
    ) -> None:
        self.method: Final = method
        self.target: Final = target
        self.path: Final = path
        self.query: Final = query
        self.version: Final = version
        self.headers: Final = headers  # names lower-cased, values as received
        self.content_length: Final = content_length
        self.chunked: Final = chunked
        self.keep_alive: Final = keep_alive  # what the request allows; end_response() decides
        self.expect_continue: Final = expect_continue
        self.head_bytes: Final = head_bytes

    def __repr__(self) -> str:
        return f"RequestHead({self.method} {self.target!r} HTTP/{self.version})"

    @property
    def has_body(self) -> bool:
        return self.chunked or bool(self.content_length)

    def header(self, name: bytes) -> bytes | None:
        for k, v in self.headers:
            if k == name:
                return v
        return None


# Header names as clients commonly spell them, each mapped to one shared lower-case
# object. A name found here is not lower-cased into a new bytes object per request (a
# method call and an allocation), and its hash is computed once, so the edge's and the
# app's lookups of it are cheaper too (docs/decisions/0008-types-decide-the-calls.md). Any other name is lower-cased as before.
_COMMON_NAMES = (
    b"accept",
    b"accept-encoding",
    b"accept-language",
    b"api-key",
    b"authorization",
    b"cache-control",
    b"connection",
    b"content-encoding",
    b"content-length",
    b"content-type",
    b"expect",
    b"host",
    b"inference-header-content-length",
    b"origin",
    b"request-timeout",
    b"traceparent",
    b"tracestate",
    b"transfer-encoding",
    b"user-agent",
    b"x-api-key",
    b"x-request-id",
    # What the openai SDKs send with every request.
    b"x-stainless-arch",
    b"x-stainless-async",
    b"x-stainless-lang",
    b"x-stainless-os",
    b"x-stainless-package-version",
    b"x-stainless-read-timeout",
    b"x-stainless-retry-count",
    b"x-stainless-runtime",
    b"x-stainless-runtime-version",
    b"x-stainless-timeout",
)


def _spellings(name: bytes) -> list[bytes]:
    """``content-type``, ``Content-Type``, ``CONTENT-TYPE``, and ``X-Request-ID``'s kind."""
    title = b"-".join(part.capitalize() for part in name.split(b"-"))
    return [name, title, name.upper(), title.replace(b"-Id", b"-ID")]


_CANONICAL: Final[dict[bytes, bytes]] = {
    spelling: name for name in _COMMON_NAMES for spelling in _spellings(name)
}

# RFC 9110 §7.2 / RFC 3986 §3.2.2: host = IP-literal / IPv4address / reg-name, then [":" port].
_HOST_RE = re.compile(rb"(\[[0-9A-Fa-f:.vV]+\]|[A-Za-z0-9\-._~!$&'()*+,;=%]*)(:[0-9]*)?")


class HeadCollector:
    """httptools callbacks for one head. Reused; ``reset()`` between requests."""

    __slots__ = ("complete", "headers", "max_headers", "too_many", "url", "valid_host")

    def __init__(self, max_headers: int) -> None:
        self.max_headers = max_headers
        # The last Host value that passed its check (kept across ``reset()``).
        self.valid_host = b""
        self.reset()

    def reset(self) -> None:
        self.url = b""
        self.headers: list[tuple[bytes, bytes]] = []
        self.complete = False
        self.too_many = False

    def on_url(self, url: bytes) -> None:
        self.url += url

    def on_header(self, name: bytes, value: bytes) -> None:
        if len(self.headers) >= self.max_headers:
            self.too_many = True
            return
        canonical = _CANONICAL.get(name)
        self.headers.append((name.lower() if canonical is None else canonical, value))

    def on_headers_complete(self) -> None:
        self.complete = True


def parse_head(
    raw: memoryview, c: HeadCollector, limits: HttpLimits, version: str = ""
) -> RequestHead:
    """Parse and validate one complete head (through its blank line). Raises
    ``ProtocolError`` with the status to answer. ``version``: the HTTP version the
    request line ends with, if the caller read it (``""``: ask the parser)."""
    c.reset()
    parser = httptools.HttpRequestParser(c)
    try:
        parser.feed_data(raw)
    except httptools.HttpParserUpgrade:
        pass  # no protocol upgrades; the request is served as plain HTTP/1.1
    except httptools.HttpParserInvalidMethodError as exc:
        raise ProtocolError(f"unsupported method: {exc}", status=501) from None
    except httptools.HttpParserInvalidURLError as exc:
        raise ProtocolError(f"invalid request target: {exc}") from None
    except httptools.HttpParserError as exc:
        raise ProtocolError(f"malformed request: {exc}") from None
    if not c.complete:
        raise ProtocolError("malformed request head")
    if c.too_many:
        raise ProtocolError("too many header fields", status=431)
    if len(c.url) > limits.max_uri_bytes:
        raise ProtocolError("request URI too long", status=414)
    return _validate(parser, c, len(raw), limits, version)


def _validate(
    parser: httptools.HttpRequestParser,
    c: HeadCollector,
    head_bytes: int,
    limits: HttpLimits,
    version: str,
) -> RequestHead:
    url, headers = c.url, c.headers
    if not version:
        version = parser.get_http_version()
    if version not in ("1.1", "1.0"):
        raise ProtocolError(f"HTTP version {version} not supported", status=505)
    content_length: int | None = None
    chunked = False
    host_count = 0
    host = b""
    conn_tokens: list[bytes] = []
    expect: bytes | None = None
    te_values: list[bytes] = []
    for name, value in headers:
        if name == b"content-length":
            if content_length is not None:
                raise ProtocolError("duplicate Content-Length")
            v = value.strip(b" \t")
            if not v.isdigit() or len(v) > 19:
                raise ProtocolError("invalid Content-Length")
            content_length = int(v)
        elif name == b"transfer-encoding":
            te_values.extend(t.strip(b" \t").lower() for t in value.split(b","))
        elif name == b"host":
            host_count += 1
            host = value.strip(b" \t")
        elif name == b"connection":
            conn_tokens.extend(t.strip(b" \t").lower() for t in value.split(b","))
        elif name == b"expect":
            expect = value.strip(b" \t").lower()
    if te_values:
        if version == "1.0":
            raise ProtocolError("Transfer-Encoding in an HTTP/1.0 request")
        if content_length is not None:
            raise ProtocolError("both Content-Length and Transfer-Encoding")
        if te_values != [b"chunked"]:
            raise ProtocolError("unsupported transfer coding")
        chunked = True
    if version == "1.1" and host_count != 1:
        raise ProtocolError("missing Host header" if not host_count else "duplicate Host header")
    if host_count > 1:
        raise ProtocolError("invalid Host header")
    # A keep-alive connection sends the same Host every time: checked once per value.
    if host and host != c.valid_host:
        if not _HOST_RE.fullmatch(host):
            raise ProtocolError("invalid Host header")
        c.valid_host = host
    if content_length is not None and content_length > limits.max_body_bytes:
        too_large = ProtocolError(
            f"request body of {content_length} bytes exceeds the limit of "
            f"{limits.max_body_bytes} bytes",
            status=413,
        )
        # A valid head: its path says which API's error format the 413 is in.
        too_large.path = split_target(url)[0]
        raise too_large
    expect_continue = False
    if expect is not None:
        if expect != b"100-continue":
            raise ProtocolError("unsupported Expect header", status=417)
        expect_continue = version == "1.1"
    # What the request allows; HttpConnection.end_response() decides.
    keep_alive = b"close" not in conn_tokens if version == "1.1" else b"keep-alive" in conn_tokens
    path, query = split_target(url)
    return RequestHead(
        method=parser.get_method().decode("ascii"),
        target=url,
        path=path,
        query=query,
        version=version,
        headers=headers,
        content_length=content_length,
        chunked=chunked,
        keep_alive=keep_alive,
        expect_continue=expect_continue,
        head_bytes=head_bytes,
    )


def split_target(url: bytes) -> tuple[str, str]:
    if url.startswith(b"/"):
        raw_path, _, raw_query = url.partition(b"?")
    elif url == b"*":
        return "*", ""
    else:  # absolute-form (RFC 9112 §3.2.2)
        try:
            parsed = httptools.parse_url(url)
        except httptools.HttpParserInvalidURLError:
            raise ProtocolError("invalid request target") from None
        raw_path = parsed.path or b"/"
        raw_query = parsed.query or b""
    path = raw_path.decode("latin-1")
    if "%" in path:
        try:
            path = unquote(path, errors="strict")
        except UnicodeDecodeError:
            raise ProtocolError("request path is not valid percent-encoded UTF-8") from None
    return path, raw_query.decode("latin-1")
