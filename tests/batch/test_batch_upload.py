"""An upload is written to disk as it arrives, never whole in memory: a server whose
arena (where request bodies are received) holds 2 MiB takes a 6 MiB batch file, sent
with a Content-Length by the openai SDK and chunked by httpx, and gives it back byte for
byte (docs/architecture.md, "The Batch API")."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import httpx

from tests.batch.conftest import upload
from tests.support import start_server

ARENA = 2 * 1024 * 1024


def _big_file() -> bytes:
    line = {
        "custom_id": "",
        "method": "POST",
        "url": "/v1/embeddings",
        "body": {"model": "echo", "input": "x" * 900},
    }
    out = bytearray()
    i = 0
    while len(out) < 3 * ARENA:
        line["custom_id"] = f"c{i}"
        out += json.dumps(line).encode() + b"\n"
        i += 1
    return bytes(out)


def test_an_upload_larger_than_the_arena_is_stored_as_it_arrives(tmp_path: Path) -> None:
    data = _big_file()
    server = start_server(
        "--model", "echo", "--data-dir", str(tmp_path / "data"), "--arena-bytes", str(ARENA)
    )
    try:
        c = server.client()
        fid = upload(c, data)  # Content-Length, multipart, as the SDK sends it
        assert c.files.content(fid).content == data
        boundary = "zeroserve-test-boundary"
        form = (
            f'--{boundary}\r\nContent-Disposition: form-data; name="purpose"\r\n\r\nbatch\r\n'
            f'--{boundary}\r\nContent-Disposition: form-data; name="file"; filename="c.jsonl"\r\n'
            "Content-Type: application/octet-stream\r\n\r\n"
        ).encode()

        def chunks() -> Iterator[bytes]:
            yield form
            for i in range(0, len(data), 100_000):
                yield data[i : i + 100_000]
            yield f"\r\n--{boundary}--\r\n".encode()

        r = httpx.post(
            server.url + "/v1/files",
            content=chunks(),
            headers={"content-type": f"multipart/form-data; boundary={boundary}"},
        )
        assert r.status_code == 200, r.text
        chunked = r.json()
        assert chunked["bytes"] == len(data) and chunked["filename"] == "c.jsonl"
        assert httpx.get(f"{server.url}/v1/files/{chunked['id']}/content").content == data
        # Nothing of the forms is left beside the files.
        names = sorted(p.name for p in (tmp_path / "data" / "files").iterdir())
        assert names == sorted([fid, chunked["id"]])
    finally:
        assert server.stop() == 0
