"""A small HTTP server of images on loopback, for the tests of remote chat images
(docs/images.md): it serves a PNG (``/cat.png``), redirects where an attacker would
(``/to-metadata``: 169.254.169.254, ``/to-private``: 10.0.0.1, ``/to-zero``: 0.0.0.0,
``/to-unlisted``: ``localhost``, not listed; ``/loop``: itself), answers more than
``CAP`` bytes (``/big``, ``/big-unannounced``), or sends a head and then nothing until
the server shuts down (``/slow``)."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from .vision import png

IMAGE = png(16, 16)
CAP = 4096


class Images(ThreadingHTTPServer):
    daemon_threads = True
    release: threading.Event
    # ``/gated``: ``asked`` is set when the request arrives, and the image is sent once
    # the test sets ``gate``.
    asked: threading.Event
    gate: threading.Event


class Handler(BaseHTTPRequestHandler):
    server: Images

    def log_message(self, format: str, *args: object) -> None:
        pass

    def _redirect(self, location: str) -> None:
        self.send_response(302)
        self.send_header("location", location)
        self.send_header("content-length", "0")
        self.end_headers()

    def do_GET(self) -> None:
        port = self.server.server_address[1]
        routes = {
            "/to-metadata": "http://169.254.169.254/latest/meta-data/",
            "/to-private": "http://10.0.0.1/cat.png",
            "/to-zero": f"http://0.0.0.0:{port}/cat.png",
            "/to-unlisted": f"http://localhost:{port}/cat.png",
            "/to-image": "/cat.png",
            "/loop": "/loop",
        }
        if self.path in routes:
            return self._redirect(routes[self.path])
        if self.path == "/cat.png":
            self.send_response(200)
            self.send_header("content-type", "image/png")
            self.send_header("content-length", str(len(IMAGE)))
            self.end_headers()
            self.wfile.write(IMAGE)
        elif self.path == "/gated":
            self.server.asked.set()
            self.server.gate.wait(60)
            self.send_response(200)
            self.send_header("content-type", "image/png")
            self.send_header("content-length", str(len(IMAGE)))
            self.end_headers()
            self.wfile.write(IMAGE)
        elif self.path == "/big":
            self.send_response(200)
            self.send_header("content-length", str(CAP + 1))
            self.end_headers()
            self.wfile.write(bytes(CAP + 1))
        elif self.path == "/big-unannounced":  # no length: read until close, then capped
            self.send_response(200)
            self.send_header("connection", "close")
            self.end_headers()
            self.wfile.write(bytes(CAP * 4))
        elif self.path == "/slow":  # a head, then nothing until the test ends
            self.send_response(200)
            self.send_header("content-length", str(len(IMAGE)))
            self.end_headers()
            self.wfile.flush()
            self.server.release.wait(60)
        else:
            self.send_response(404)
            self.send_header("content-length", "0")
            self.end_headers()


@contextmanager
def serve_images() -> Iterator[str]:
    """The server on a free loopback port, as its base URL; shut down on exit."""
    with image_server() as server:
        yield f"http://127.0.0.1:{server.server_address[1]}"


@contextmanager
def image_server() -> Iterator[Images]:
    """The server itself (its events drive ``/gated``); shut down on exit."""
    server = Images(("127.0.0.1", 0), Handler)
    server.release, server.asked, server.gate = (
        threading.Event(),
        threading.Event(),
        threading.Event(),
    )
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.gate.set()
        server.release.set()
        server.shutdown()
        server.server_close()
