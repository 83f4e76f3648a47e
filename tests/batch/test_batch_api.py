"""The Files and Batch APIs end to end with the official openai SDK against a real
``zeroserve serve --data-dir`` process (docs/architecture.md, "The Batch API"): the
lifecycle, the four endpoints a line may name, hostile uploads, the limits, ownership
by API key, and the key's quota counting the lines."""

from __future__ import annotations

import io
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from tests.batch.conftest import completion_lines, jsonl, results, upload
from tests.support import ServerProcess, start_server, wait_until

ALICE, BOB = "sk-alice-0123456789abcdef", "sk-bob-0123456789abcdef"
LIMITS = {
    "ZEROSERVE_BATCH__MAX_LINES": "12",
    "ZEROSERVE_BATCH__MAX_LINE_BYTES": "4096",
    "ZEROSERVE_BATCH__MAX_FILE_BYTES": "65536",
}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    root = tmp_path_factory.mktemp("batch")
    keys = root / "keys.toml"
    keys.write_text(f'[keys.alice]\nkey = "{ALICE}"\n[keys.bob]\nkey = "{BOB}"\n')
    srv = start_server(
        "--model", "echo", "--data-dir", str(root / "data"), "--api-keys-file", str(keys),
        env=LIMITS,
    )  # fmt: skip
    yield srv
    assert srv.stop() == 0


def _finished(c: openai.OpenAI, batch_id: str) -> Any:
    wait_until(
        lambda: c.batches.retrieve(batch_id).status in ("completed", "failed"),
        30,
        "the batch to end",
        interval=0.05,
    )
    return c.batches.retrieve(batch_id)


def test_the_sdk_runs_a_batch_of_each_endpoint(server: ServerProcess) -> None:
    c = server.client(ALICE)
    bodies: dict[str, dict[str, Any]] = {
        "/v1/chat/completions": {
            "model": "echo",
            "messages": [{"role": "user", "content": "hello there"}],
            "max_tokens": 2,
        },
        "/v1/completions": {"model": "echo", "prompt": "one two", "max_tokens": 2},
        "/v1/embeddings": {"model": "echo", "input": ["a", "b"]},
        "/v1/responses": {"model": "echo", "input": "hi you", "max_output_tokens": 2},
    }
    for url, body in bodies.items():
        lines = [
            {"custom_id": f"{url}-{i}", "method": "POST", "url": url, "body": body}
            for i in range(3)
        ]
        f = c.files.create(file=("in.jsonl", io.BytesIO(jsonl(lines))), purpose="batch")
        assert (f.object, f.purpose, f.filename) == ("file", "batch", "in.jsonl")
        assert c.files.retrieve(f.id).bytes == len(jsonl(lines))
        assert c.files.content(f.id).content == jsonl(lines)  # the upload, byte for byte
        batch = c.batches.create(
            input_file_id=f.id,
            endpoint=url,  # type: ignore[arg-type]
            completion_window="24h",
            metadata={"run": "sdk"},
        )
        assert batch.status in ("validating", "in_progress", "finalizing", "completed")
        assert batch.metadata == {"run": "sdk"}
        done = _finished(c, batch.id)
        assert done.status == "completed", done
        assert done.request_counts is not None
        assert (done.request_counts.total, done.request_counts.completed) == (3, 3)
        assert done.error_file_id is None
        assert done.completed_at is not None and done.expires_at is not None
        out = results(c, done.output_file_id)
        assert [r["custom_id"] for r in out] == [f"{url}-{i}" for i in range(3)]
        for r in out:
            assert r["error"] is None and r["response"]["status_code"] == 200
            answer = r["response"]["body"]
            assert answer["object"] in ("chat.completion", "text_completion", "list", "response")
        output = c.files.retrieve(done.output_file_id)  # type: ignore[arg-type]
        assert output.purpose == "batch_output"


def test_a_bad_line_fails_alone_into_the_error_file(server: ServerProcess) -> None:
    c = server.client(ALICE)
    lines: list[Any] = [
        *completion_lines(2, "echo", "good"),
        {"custom_id": "wrong-url", "method": "POST", "url": "/v1/embeddings", "body": {}},
        {"custom_id": "no-model", "method": "POST", "url": "/v1/completions",
         "body": {"model": "no-such-model", "prompt": "x"}},
        {"custom_id": "bad-field", "method": "POST", "url": "/v1/completions",
         "body": {"model": "echo", "prompt": "x", "not_a_parameter": 1}},
        {"custom_id": "streams", "method": "POST", "url": "/v1/completions",
         "body": {"model": "echo", "prompt": "x", "stream": True}},
        {"method": "POST", "url": "/v1/completions", "body": {"model": "echo"}},
        ["not", "an", "object"],
    ]  # fmt: skip
    batch = c.batches.create(
        input_file_id=upload(c, jsonl(lines)),
        endpoint="/v1/completions",
        completion_window="24h",
    )
    done = _finished(c, batch.id)
    assert done.status == "completed"
    assert done.request_counts is not None
    assert (done.request_counts.completed, done.request_counts.failed) == (2, 6)
    errors = results(c, done.error_file_id)
    by_id = {r["custom_id"]: r for r in errors}
    assert by_id["wrong-url"]["error"]["code"] == "invalid_url"
    assert by_id["no-model"]["response"]["status_code"] == 404
    assert by_id["no-model"]["response"]["body"]["error"]["code"] == "model_not_found"
    assert by_id["bad-field"]["response"]["status_code"] == 400
    assert by_id["bad-field"]["response"]["body"]["error"]["param"] == "not_a_parameter"
    assert by_id["streams"]["error"]["code"] == "invalid_body"
    assert [r["error"]["code"] for r in errors if r["custom_id"] is None] == [
        "missing_custom_id",
        "invalid_line",
    ]
    assert "no-such-model" not in json.dumps(errors)  # errors never echo the input


def test_hostile_uploads_are_refused_before_work_starts(server: ServerProcess) -> None:
    c = server.client(ALICE)
    with pytest.raises(openai.BadRequestError, match="not JSONL: line 2"):
        upload(c, b'{"custom_id": "a"}\nthis is not json\n')
    with pytest.raises(openai.BadRequestError, match="line 1 is longer than 4096 bytes"):
        upload(c, json.dumps({"custom_id": "x" * 5000}).encode())
    with pytest.raises(openai.BadRequestError, match="more than 12 requests"):
        upload(c, jsonl(completion_lines(13, "echo")))
    with pytest.raises(openai.BadRequestError, match="no requests"):
        upload(c, b"\n\n")
    with pytest.raises(openai.APIStatusError) as too_big:
        upload(c, b"{}\n" * 30000)
    assert too_big.value.status_code == 413
    mark = "b0undary"
    chunked = httpx.post(
        server.url + "/v1/files",
        content=iter(
            [
                f'--{mark}\r\nContent-Disposition: form-data; name="file"; filename="a"\r\n\r\n'.encode(),
                *([b"{}\n" * 10_000] * 5),  # past the limit (and the form's), no length said
                f"\r\n--{mark}--\r\n".encode(),
            ]
        ),
        headers={
            "content-type": f"multipart/form-data; boundary={mark}",
            "authorization": f"Bearer {ALICE}",
        },
    )
    assert chunked.status_code == 413, chunked.text
    with pytest.raises(openai.BadRequestError, match="purpose"):
        c.files.create(file=("a.jsonl", io.BytesIO(b"{}\n")), purpose="assistants")
    r = httpx.post(
        server.url + "/v1/files", content=b"{}", headers={"authorization": f"Bearer {ALICE}"}
    )
    assert r.status_code == 400 and r.json()["error"]["param"] == "file"
    fid = upload(c, jsonl(completion_lines(1, "echo")))
    for bad, param in (
        ({"endpoint": "/v1/raw/echo"}, "endpoint"),
        ({"completion_window": "1h"}, "completion_window"),
        ({"input_file_id": "file-nope"}, "file_id"),
    ):
        body = {
            "input_file_id": fid,
            "endpoint": "/v1/completions",
            "completion_window": "24h",
            **bad,
        }
        r = httpx.post(
            server.url + "/v1/batches", json=body, headers={"authorization": f"Bearer {ALICE}"}
        )
        assert r.status_code in (400, 404) and r.json()["error"]["param"] == param, r.text


def test_files_and_batches_belong_to_their_key(server: ServerProcess) -> None:
    alice, bob = server.client(ALICE), server.client(BOB)
    fid = upload(alice, jsonl(completion_lines(1, "echo")))
    batch = alice.batches.create(
        input_file_id=fid, endpoint="/v1/completions", completion_window="24h"
    )
    for call in (
        lambda: bob.files.retrieve(fid),
        lambda: bob.files.content(fid),
        lambda: bob.files.delete(fid),
        lambda: bob.batches.retrieve(batch.id),
        lambda: bob.batches.cancel(batch.id),
        lambda: bob.batches.create(
            input_file_id=fid, endpoint="/v1/completions", completion_window="24h"
        ),
    ):
        with pytest.raises(openai.NotFoundError):
            call()
    assert batch.id not in [b.id for b in bob.batches.list()]
    assert fid not in [f.id for f in bob.files.list()]
    with pytest.raises(openai.AuthenticationError):
        server.client("sk-wrong").batches.retrieve(batch.id)
    _finished(alice, batch.id)
    assert alice.files.delete(fid).deleted
    with pytest.raises(openai.NotFoundError):
        alice.files.retrieve(fid)


def test_list_pages_with_after_and_limit(server: ServerProcess) -> None:
    c = server.client(BOB)
    fid = upload(c, jsonl(completion_lines(1, "echo")))
    made = [
        c.batches.create(input_file_id=fid, endpoint="/v1/completions", completion_window="24h").id
        for _ in range(3)
    ]
    first = c.batches.list(limit=2)
    assert len(first.data) == 2 and first.has_more
    rest = c.batches.list(limit=2, after=first.data[-1].id)
    seen = [b.id for b in first.data] + [b.id for b in rest.data]
    assert set(made) <= set(seen) and len(seen) == len(set(seen))
    r = httpx.get(server.url + "/v1/batches?limit=0", headers={"authorization": f"Bearer {BOB}"})
    assert r.status_code == 400 and r.json()["error"]["param"] == "limit"


def test_lines_count_against_the_keys_quota(server: ServerProcess) -> None:
    def tokens_of(key: str) -> float:
        text = httpx.get(server.url + "/metrics").text
        prefix = f'zeroserve_api_key_tokens_total{{key="{key}"}} '
        return float(next(x for x in text.splitlines() if x.startswith(prefix)).split()[-1])

    c = server.client(ALICE)
    fid = upload(c, jsonl(completion_lines(5, "echo")))
    before = tokens_of("alice"), tokens_of("bob")
    batch = c.batches.create(input_file_id=fid, endpoint="/v1/completions", completion_window="24h")
    done = _finished(c, batch.id)
    used = sum(
        r["response"]["body"]["usage"]["total_tokens"] for r in results(c, done.output_file_id)
    )
    assert used > 0
    # The lines' tokens, and only they, went to the key that made the batch.
    assert (tokens_of("alice") - before[0], tokens_of("bob") - before[1]) == (used, 0)


def test_no_data_dir_no_batch_api(tmp_path: Path) -> None:
    srv = start_server("--model", "echo")
    try:
        assert httpx.get(srv.url + "/v1/batches").status_code == 404
    finally:
        assert srv.stop() == 0


def test_a_line_for_a_remote_model_is_relayed(tmp_path: Path) -> None:
    upstream = start_server("--model", "echo")
    try:
        gateway = start_server(
            "--model", f"gw=remote:{upstream.url}/v1?upstream_model=echo",
            "--data-dir", str(tmp_path / "data"),
        )  # fmt: skip
        try:
            c = gateway.client()
            lines = [
                {"custom_id": f"r{i}", "method": "POST", "url": "/v1/chat/completions",
                 "body": {"model": "gw", "messages": [{"role": "user", "content": f"w{i}"}],
                          "max_tokens": 3}}
                for i in range(3)
            ]  # fmt: skip
            batch = c.batches.create(
                input_file_id=upload(c, jsonl(lines)),
                endpoint="/v1/chat/completions",
                completion_window="24h",
            )
            done = _finished(c, batch.id)
            assert done.status == "completed" and done.error_file_id is None, done
            out = results(c, done.output_file_id)
            assert [r["custom_id"] for r in out] == ["r0", "r1", "r2"]
            for i, r in enumerate(out):
                answer = r["response"]["body"]
                assert r["response"]["status_code"] == 200
                assert f"w{i}" in answer["choices"][0]["message"]["content"]
        finally:
            assert gateway.stop() == 0
    finally:
        assert upstream.stop() == 0
