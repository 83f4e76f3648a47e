"""``GET /``: the playground and live dashboard, three static files shipped in the
package (docs/architecture.md, "The page at /").

The files are read once when the app is built and answered from memory: each route's
``Response`` (body and headers) is made once and reused, so a request costs what
``/health`` costs plus the body's bytes, and nothing runs while nobody has the page open.
The page's script polls ``/v1/stats``; it never parses Prometheus text.

Every answer carries a strict Content-Security-Policy: scripts and styles only from
this origin (no inline code), requests only to this origin, no frames, no plugins, no
forms. Model output is rendered as text by the script (never as HTML), so a page that
shows ``<script>`` from a model runs nothing even if the policy were lifted.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from importlib import resources

from ..request import Request
from ..response import Response
from ..router import RouteDoc, Router

CONTENT_SECURITY_POLICY = (
    b"default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; "
    b"connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
)
# path -> (file, content type)
FILES: dict[str, tuple[str, bytes]] = {
    "/": ("index.html", b"text/html; charset=utf-8"),
    "/ui/app.js": ("app.js", b"text/javascript; charset=utf-8"),
    "/ui/app.css": ("app.css", b"text/css; charset=utf-8"),
}
_DOCS = {
    "/": RouteDoc("The playground and live dashboard page (HTML)"),
    "/ui/app.js": RouteDoc("The page's script"),
    "/ui/app.css": RouteDoc("The page's style sheet"),
}
# The page's weight budget (all files, uncompressed): it must stay a small page.
MAX_PAGE_BYTES = 60 * 1024


def page_bytes() -> dict[str, bytes]:
    """The page's files (path -> bytes), read from the package."""
    static = resources.files("zeroserve.app").joinpath("static")
    return {path: static.joinpath(name).read_bytes() for path, (name, _) in FILES.items()}


def register(router: Router) -> None:
    for path, body in page_bytes().items():
        ctype = FILES[path][1]
        etag = b'"' + hashlib.blake2b(body, digest_size=8).hexdigest().encode("ascii") + b'"'
        headers = [
            (b"content-type", ctype),
            (b"content-security-policy", CONTENT_SECURITY_POLICY),
            (b"x-content-type-options", b"nosniff"),
            (b"referrer-policy", b"no-referrer"),
            (b"cache-control", b"no-cache"),
            (b"etag", etag),
        ]
        full = Response(200, [body], headers=headers)
        not_modified = Response(304, [], headers=[h for h in headers if h[0] != b"content-type"])
        router.add("GET", path, _serve(full, not_modified, etag), doc=_DOCS[path])


def _serve(full: Response, not_modified: Response, etag: bytes) -> Callable[[Request], Response]:
    def serve(req: Request) -> Response:
        return not_modified if req.header(b"if-none-match") == etag else full

    return serve
