"""URL pulls against a loopback server: resume after a dropped connection, pins, http refusal."""

from __future__ import annotations

import hashlib
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from zeroserve.errors import RequestError, UpstreamError
from zeroserve.models.cache import HashMismatch, cached_models
from zeroserve.models.pull import pull

PAYLOAD = bytes(range(256)) * 4096  # 1 MiB, distinct bytes so a bad resume shows


class _Hub(ThreadingHTTPServer):
    drop_after: int | None = None
    ranges: list[str | None]


class _Handler(BaseHTTPRequestHandler):
    server: _Hub

    def log_message(self, format: str, *args: object) -> None:
        return

    def do_GET(self) -> None:
        rng = self.headers.get("Range")
        self.server.ranges.append(rng)
        start = int(rng.removeprefix("bytes=").rstrip("-")) if rng else 0
        body = PAYLOAD[start:]
        self.send_response(206 if rng else 200)
        self.send_header("Content-Length", str(len(body)))
        if rng:
            self.send_header("Content-Range", f"bytes {start}-{len(PAYLOAD) - 1}/{len(PAYLOAD)}")
        self.end_headers()
        drop = self.server.drop_after
        if drop is not None:
            self.server.drop_after = None
            self.wfile.write(body[:drop])
            self.wfile.flush()
            self.close_connection = True
            return
        self.wfile.write(body)


@pytest.fixture
def hub(monkeypatch: pytest.MonkeyPatch) -> Iterator[_Hub]:
    monkeypatch.setenv("ZEROSERVE_PULL_ALLOW_HTTP", "1")
    server = _Hub(("127.0.0.1", 0), _Handler)
    server.ranges = []
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()
    thread.join()


def _url(hub: _Hub) -> str:
    return f"http://127.0.0.1:{hub.server_address[1]}/m/tiny.gguf"


def test_dropped_download_resumes(hub: _Hub, tmp_path: Path) -> None:
    hub.drop_after = 300_000
    with pytest.raises(UpstreamError, match="stopped at 300000 of 1048576"):
        pull(_url(hub), tmp_path)
    assert cached_models(tmp_path) == []
    path = pull(_url(hub), tmp_path)
    assert path.read_bytes() == PAYLOAD
    assert hub.ranges == [None, "bytes=300000-"]
    assert [name for name, _ in cached_models(tmp_path)] == ["tiny"]
    assert pull(_url(hub), tmp_path) == path  # cached: no third request
    assert len(hub.ranges) == 2


def test_pinned_url(hub: _Hub, tmp_path: Path) -> None:
    good = hashlib.sha256(PAYLOAD).hexdigest()
    assert pull(f"{_url(hub)}?sha256={good}", tmp_path).read_bytes() == PAYLOAD
    wrong = "0" * 64
    with pytest.raises(HashMismatch) as info:
        pull(f"{_url(hub)}?sha256={wrong}", tmp_path)
    assert wrong in str(info.value) and good in str(info.value)
    assert cached_models(tmp_path) == []


def test_plain_http_refused_by_default(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("ZEROSERVE_PULL_ALLOW_HTTP", raising=False)
    with pytest.raises(RequestError, match="plain http"):
        pull("http://127.0.0.1:9/m/x.gguf", tmp_path)


def test_cli_pull_list_rm(
    hub: _Hub, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from zeroserve.cli import main

    monkeypatch.setenv("ZEROSERVE_CACHE", str(tmp_path))
    assert main(["pull", _url(hub)]) == 0
    assert main(["list"]) == 0
    assert f"tiny\t{len(PAYLOAD)}\t" in capsys.readouterr().out
    assert main(["rm", "tiny"]) == 0
    assert cached_models(tmp_path) == []
    assert main(["rm", "tiny"]) == 1
    assert "no cached model named 'tiny'" in capsys.readouterr().err
