"""The Files and Batch routes hold to ``/openapi.json`` (docs/architecture.md, "The Batch
API"), driven by Schemathesis from the server's own document, as
``tests/app/openai/test_contract.py`` drives the model routes:

* requests drawn from the document (``POST /v1/files`` as ``multipart/form-data``, as the
  openai SDK sends it) never get a 5xx, and every answer, 2xx or 4xx, has the documented
  shape (the error shape for a refusal);
* requests the document calls invalid are refused with a 4xx.

What a drawn request cannot be is *accepted*: a file's content is JSONL of batch
requests and a batch names an uploaded file, which JSON Schema cannot express (a random
``binary`` is not JSONL; a random id names nothing), so the 2xx answers' shapes are
checked on a real run instead: the SDK's upload, batch, list, retrieve, content and
cancel, each answer validated against the same document."""

from __future__ import annotations

import io
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, Phase, given, settings

from tests.batch.conftest import completion_lines, jsonl
from tests.support import ServerProcess, scaled, start_server, wait_until

schemathesis = pytest.importorskip("schemathesis")
from schemathesis import checks  # noqa: E402
from schemathesis.generation import GenerationMode  # noqa: E402

ROUTES = [
    ("POST", "/v1/files"),
    ("GET", "/v1/files"),
    ("GET", "/v1/files/{file_id}"),
    ("DELETE", "/v1/files/{file_id}"),
    ("GET", "/v1/files/{file_id}/content"),
    ("POST", "/v1/batches"),
    ("GET", "/v1/batches"),
    ("GET", "/v1/batches/{batch_id}"),
    ("POST", "/v1/batches/{batch_id}/cancel"),
]
# The routes with something a request can get wrong by the document (a body): the others
# take only ids, any string, so no request to them is invalid by its shape.
BODIES = [("POST", "/v1/files"), ("POST", "/v1/batches")]
DRAW = settings(
    max_examples=15,
    deadline=None,
    database=None,
    derandomize=True,
    phases=[Phase.generate],
    suppress_health_check=list(HealthCheck),
)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    root = tmp_path_factory.mktemp("batch-contract")
    srv = start_server("--model", "echo", "--data-dir", str(root / "data"))
    yield srv
    assert srv.stop() == 0


@pytest.fixture(scope="module")
def document(server: ServerProcess) -> Any:
    return schemathesis.openapi.from_dict(httpx.get(server.url + "/openapi.json").json())


def _operation(document: Any, method: str, path: str) -> Any:
    return document[path][method]


def test_the_upload_is_documented_as_the_sdk_sends_it(server: ServerProcess) -> None:
    doc = httpx.get(server.url + "/openapi.json").json()
    paths = doc["paths"]
    content = paths["/v1/files"]["post"]["requestBody"]["content"]
    assert list(content) == ["multipart/form-data"]
    form = content["multipart/form-data"]["schema"]
    assert form["required"] == ["purpose", "file"]
    assert form["properties"]["purpose"]["enum"] == ["batch"]
    assert form["properties"]["file"]["format"] == "binary"
    assert "requestBody" not in paths["/v1/batches/{batch_id}/cancel"]["post"]
    assert set(paths["/v1/batches"]["post"]["requestBody"]["content"]) == {"application/json"}


@pytest.mark.parametrize(
    ("mode", "method", "path"),
    [*(("positive", m, p) for m, p in ROUTES), *(("negative", m, p) for m, p in BODIES)],
)
def test_drawn_requests_are_answered_in_the_documented_shapes(
    server: ServerProcess, document: Any, method: str, path: str, mode: str
) -> None:
    operation = _operation(document, method, path)
    generation = GenerationMode.POSITIVE if mode == "positive" else GenerationMode.NEGATIVE
    wanted = [checks.not_a_server_error, checks.response_schema_conformance]
    if mode == "negative":
        wanted.append(checks.negative_data_rejection)

    @DRAW
    @given(operation.as_strategy(generation_mode=generation))
    def run(case: Any) -> None:
        response = case.call(base_url=server.url, timeout=scaled(30))
        case.validate_response(response, checks=wanted)
        if response.status_code >= 400:
            assert set(response.json()) == {"error"}, response.text

    run()


def test_a_real_run_is_answered_in_the_documented_shapes(
    server: ServerProcess, document: Any, tmp_path: Path
) -> None:
    """The SDK's calls, each answer checked against the document by Schemathesis."""

    def check(method: str, path: str, response: Any, **params: str) -> None:
        case = _operation(document, method, path).Case(path_parameters=params or None)
        response.request.read()
        response.read()
        response.close()
        assert response.status_code == 200, response.text
        case.validate_response(response, checks=[checks.response_schema_conformance])

    c = server.client().with_raw_response
    data = jsonl(completion_lines(3, "echo"))
    up = c.files.create(file=("in.jsonl", io.BytesIO(data)), purpose="batch")
    check("POST", "/v1/files", up.http_response)
    fid = up.parse().id
    check("GET", "/v1/files", c.files.list().http_response)
    check("GET", "/v1/files/{file_id}", c.files.retrieve(fid).http_response, file_id=fid)
    made = c.batches.create(input_file_id=fid, endpoint="/v1/completions", completion_window="24h")
    check("POST", "/v1/batches", made.http_response)
    bid = made.parse().id
    plain = server.client()
    wait_until(
        lambda: plain.batches.retrieve(bid).status == "completed",
        30,
        "the batch to complete",
        interval=0.05,
    )
    done = c.batches.retrieve(bid)
    check("GET", "/v1/batches/{batch_id}", done.http_response, batch_id=bid)
    check("GET", "/v1/batches", c.batches.list().http_response)
    out = done.parse().output_file_id
    assert out is not None
    content = plain.files.content(out).content
    assert sorted(json.loads(x)["custom_id"] for x in content.splitlines()) == [
        "line-0", "line-1", "line-2"
    ]  # fmt: skip
    # A second batch, cancelled: the cancel's answer has the batch's shape too.
    other = plain.batches.create(
        input_file_id=fid, endpoint="/v1/completions", completion_window="24h"
    )
    cancel = c.batches.cancel(other.id)
    check("POST", "/v1/batches/{batch_id}/cancel", cancel.http_response, batch_id=other.id)
    wait_until(
        lambda: plain.batches.retrieve(other.id).status in ("cancelled", "completed"),
        30,
        "the second batch to end",
        interval=0.05,
    )
    gone = c.files.delete(fid)
    check("DELETE", "/v1/files/{file_id}", gone.http_response, file_id=fid)
