"""Images in chat: the one image part every front end translates into, and the checks
made where a request is decoded (docs/architecture.md, "Images in chat").

Strategy
--------
An image arrives as base64 text inside the JSON body (a ``data:`` URI on the OpenAI
routes, a ``base64`` source on Anthropic's) or as an ``http(s)`` URL. The base64 text is
never decoded into a Python ``bytes`` or ``str`` here: the part keeps a ``memoryview`` of
it inside the request body (msgspec's ``Raw`` is a view of the body, no copy), and

* its size is computed from its length (``3 * len / 4`` less the padding) and checked
  against ``ApiLimits.image_bytes`` before anything else reads it (413 naming the part);
* its alphabet is checked by one regular expression run over the view (no copy);
* its media type is read from its magic bytes: the first 16 base64 characters decode to
  the 12 bytes that tell PNG, JPEG, GIF and WebP apart (400 naming the part otherwise).

llama.cpp's engine takes images only as base64 ``data:`` URIs inside its JSON request
(docs/decisions/0032-images-stay-base64.md), so decoding here would only add a copy and
a re-encoding: the text is copied once, from the body view into the engine's request
(``wire.splice_images``, counted as ``image_engine``). An image fetched from a URL
arrives as bytes and is base64-encoded once for the engine (counted as
``image_base64``).

The view is good while the request holds its body (its lease): every backend reads it
while the handler runs (llama.cpp's engine requests are built before any choice starts),
never from a stream after the answer began.

A JSON string may escape characters (``\\/`` for ``/``); such a string is unescaped
first, one counted copy (``image_unescape``), since the view is no longer the text.
"""

from __future__ import annotations

import binascii
import re

import msgspec

from ... import metrics
from ...errors import PayloadTooLarge, RequestError
from ..limits import ApiLimits, check_count

# The media types served, by their magic bytes (the first bytes of the file).
PNG, JPEG, GIF, WEBP = "image/png", "image/jpeg", "image/gif", "image/webp"
MEDIA_TYPES = (PNG, JPEG, GIF, WEBP)
# Base64 characters read to sniff the media type: 16 characters are 12 bytes, enough for
# WebP's "RIFF....WEBP", the longest signature here.
SNIFF_CHARS = 16
# Longest ``data:`` URI header read before its comma ("data:image/jpeg;base64" is 22
# characters; parameters such as ";name=..." may come before ";base64").
MAX_DATA_URI_HEADER = 256
# Longest remote image URL accepted, in characters (browsers and CDNs cap URLs near
# 8 KiB; an image URL is a few hundred characters).
MAX_IMAGE_URL_CHARS = 8192

_BASE64 = re.compile(rb"[A-Za-z0-9+/]*={0,2}")
_ESCAPE = re.compile(rb"\\")
_MEDIA_TYPE = re.compile(r"image/[A-Za-z0-9.+-]+")


def sniff(head: bytes) -> str | None:
    """The media type that the first bytes of an image say, or None."""
    if head.startswith(b"\x89PNG\r\n\x1a\n"):
        return PNG
    if head.startswith(b"\xff\xd8\xff"):
        return JPEG
    if head.startswith((b"GIF87a", b"GIF89a")):
        return GIF
    if head[:4] == b"RIFF" and head[8:12] == b"WEBP":
        return WEBP
    return None


class ImagePart:
    """One image of a turn, checked.

    ``param``: where the client's API puts it (``messages[0].content[1]``), for every
    error that names it; ``detail``: OpenAI's ``detail``, when given, and ``detail_param``
    where it was. Exactly one of ``base64`` (a view of the base64 text in the request
    body, or of its unescaped copy), ``data`` (the image's bytes, once fetched) and
    ``url`` (a remote image not yet fetched) holds the image; ``media_type`` and
    ``size`` (bytes of the image) are known unless it is remote.

    A plain class, like the chat request it belongs to."""

    __slots__ = ("base64", "data", "detail", "detail_param", "media_type", "param", "size", "url")

    def __init__(
        self,
        param: str,
        *,
        base64: memoryview | None = None,
        url: str | None = None,
        media_type: str = "",
        size: int = 0,
        detail: str | None = None,
        detail_param: str | None = None,
    ) -> None:
        self.param = param
        self.base64 = base64
        self.data: bytearray | None = None
        self.url = url
        self.media_type = media_type
        self.size = size
        self.detail = detail
        self.detail_param = detail_param

    @property
    def remote(self) -> bool:
        """A URL not fetched yet."""
        return self.base64 is None and self.data is None

    def base64_text(self) -> memoryview:
        """The image as base64 text: the view of the request's text, or a fetched
        image's bytes encoded once (counted, ``image_base64``) and kept."""
        if self.base64 is None:
            assert self.data is not None, "a remote image is fetched first"
            encoded = binascii.b2a_base64(self.data, newline=False)
            metrics.count_copy("image_base64", len(encoded))
            self.base64 = memoryview(encoded)
            self.data = None
        return self.base64

    def fetched(self, data: bytearray) -> None:
        """The remote image arrived (within the fetch's size cap): its media type is
        checked as an inline image's is."""
        media_type = sniff(bytes(data[:12]))
        if media_type is None:
            raise _not_an_image(self.param)
        self.data = data
        self.media_type = media_type
        self.size = len(data)
        self.url = None


def _not_an_image(param: str) -> RequestError:
    return RequestError(
        "the image is not a PNG, JPEG, GIF or WebP file (its first bytes say so)",
        param=param,
        code="invalid_image",
    )


class ImageReader:
    """Reads one request's images (``limits``: their count and each one's size)."""

    __slots__ = ("count", "limits")

    def __init__(self, limits: ApiLimits) -> None:
        self.limits = limits
        self.count = 0

    def _counted(self, param: str) -> None:
        self.count += 1
        check_count(self.count, self.limits.images, param, "images")

    def url(
        self,
        raw: msgspec.Raw,
        param: str,
        *,
        detail: str | None = None,
        detail_param: str | None = None,
    ) -> ImagePart:
        """An OpenAI image URL (``raw``: its JSON string, as sent): a ``data:`` URI of
        base64 text, or an ``http(s)`` URL to fetch later."""
        self._counted(param)
        return self._url(_string(raw, param), param, detail, detail_param)

    def remote(self, url: str, param: str) -> ImagePart:
        """An image given by URL alone (Anthropic's ``url`` source)."""
        self._counted(param)
        return self._url(memoryview(url.encode()), param, None, None)

    def _url(
        self, view: memoryview, param: str, detail: str | None, detail_param: str | None
    ) -> ImagePart:
        if bytes(view[:5]).lower() == b"data:":
            comma = bytes(view[:MAX_DATA_URI_HEADER]).find(b",")
            if comma < 0:
                raise RequestError(
                    "a data: URI needs a comma before its data", param=param, code="invalid_image"
                )
            header = bytes(view[5:comma]).decode("latin-1").lower()
            kind, _, rest = header.partition(";")
            if not rest.endswith("base64") or rest.rpartition(";")[2] != "base64":
                raise RequestError(
                    "a data: URI of an image must be base64 (data:image/png;base64,...)",
                    param=param,
                    code="invalid_image",
                )
            if kind and not _MEDIA_TYPE.fullmatch(kind):
                raise RequestError(
                    "a data: URI of an image must have an image/* media type",
                    param=param,
                    code="invalid_image",
                )
            return self._base64(view[comma + 1 :], param, detail, detail_param)
        text = bytes(view[: MAX_IMAGE_URL_CHARS + 1]).decode("utf-8", "replace")
        lower = text[:8].lower()
        if not (lower.startswith("http://") or lower.startswith("https://")):
            raise RequestError(
                "an image URL must be a data: URI (base64) or an http(s) URL",
                param=param,
                code="invalid_image_url",
            )
        if len(view) > MAX_IMAGE_URL_CHARS:
            raise RequestError(
                f"the image URL is longer than {MAX_IMAGE_URL_CHARS} characters",
                param=param,
                code="invalid_image_url",
            )
        return ImagePart(param, url=text, detail=detail, detail_param=detail_param)

    def base64(self, raw: msgspec.Raw, media_type: str | None, param: str) -> ImagePart:
        """Anthropic's base64 source (``raw``: its ``data`` string as sent;
        ``media_type``: the type it declares, which must be what the bytes say)."""
        self._counted(param)
        part = self._base64(_string(raw, f"{param}.source.data"), param, None, None)
        if media_type is not None and media_type != part.media_type:
            raise RequestError(
                f"the image's bytes are {part.media_type}, not the declared {media_type}",
                param=f"{param}.source.media_type",
                code="invalid_image",
            )
        return part

    def _base64(
        self, text: memoryview, param: str, detail: str | None, detail_param: str | None
    ) -> ImagePart:
        n = len(text)
        pad = (text[n - 1] == 0x3D) + (n > 1 and text[n - 2] == 0x3D) if n else 0
        size = n // 4 * 3 - pad
        limit = self.limits.image_bytes
        if size > limit:  # before the text is read any further
            raise PayloadTooLarge(f"the image is {size} bytes; the limit is {limit}", param=param)
        if not n or n % 4 or not _BASE64.fullmatch(text):
            raise RequestError(
                "the image's data is not base64 (A-Z, a-z, 0-9, +, /, padded with = to a "
                "multiple of 4 characters)",
                param=param,
                code="invalid_image",
            )
        media_type = sniff(binascii.a2b_base64(text[:SNIFF_CHARS]))
        if media_type is None:
            raise _not_an_image(param)
        return ImagePart(
            param,
            base64=text,
            media_type=media_type,
            size=size,
            detail=detail,
            detail_param=detail_param,
        )


def _string(raw: msgspec.Raw, param: str) -> memoryview:
    """The characters of a JSON string kept raw: a view of them when it has no escapes,
    else its unescaped text (one counted copy)."""
    view = memoryview(raw)
    if len(view) < 2 or view[0] != 0x22:  # '"'
        raise RequestError(f"'{param}' must be a string", param=param)
    inner = view[1:-1]
    if _ESCAPE.search(inner) is None:  # a scan of the view, no copy
        return inner
    text: str = msgspec.json.decode(view, type=str)
    unescaped = text.encode("utf-8")
    metrics.count_copy("image_unescape", len(unescaped))
    return memoryview(unescaped)
