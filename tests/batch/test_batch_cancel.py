"""Cancelling a running batch, and the limits that need one to stay open: the key's open
batches and the disk space left (docs/architecture.md, "The Batch API"). The gated model
finishes one generation per byte the test writes."""

from __future__ import annotations

from pathlib import Path

import httpx
import openai
import pytest

from tests.batch.conftest import Gate, completion_lines, gated_batch, jsonl, results, upload
from tests.support import start_server, wait_until

MODEL = "gated=tests.support.models.batch:PipeGated"


def test_cancel_keeps_what_finished_and_reports_the_rest(tmp_path: Path, gate: Gate) -> None:
    # One line in flight at a time, so the test knows which are running.
    env = {
        **gate.env,
        "ZEROSERVE_BATCH__MAX_OPEN_BATCHES": "1",
        "ZEROSERVE_BATCH__LINES_PER_MODEL": "1",
        "ZEROSERVE_BATCH__LINES_QUEUED": "0",
    }
    server = start_server("--model", MODEL, "--data-dir", str(tmp_path / "data"), env=env)
    try:
        c = server.client()
        fid, batch = gated_batch(c, gate, 5, 1)
        # The key's one open batch: a second is refused before any work.
        with pytest.raises(openai.RateLimitError, match="batches that have not ended"):
            c.batches.create(input_file_id=fid, endpoint="/v1/completions", completion_window="24h")
        # Its input cannot be deleted while it runs.
        with pytest.raises(openai.BadRequestError, match="has not ended"):
            c.files.delete(fid)
        wait_until(lambda: len(gate.log("started")) >= 2, 30, "a second line running")
        cancelling = c.batches.cancel(batch.id)
        assert cancelling.status == "cancelling" and cancelling.cancelling_at is not None
        # The line in flight finishes (it is not cut); nothing new starts.
        gate.open(1)
        wait_until(
            lambda: c.batches.retrieve(batch.id).status == "cancelled",
            30,
            "the batch cancelled",
            interval=0.05,
        )
        done = c.batches.retrieve(batch.id)
        assert done.cancelled_at is not None and done.request_counts is not None
        assert len(gate.log("finished")) == 2
        out, err = results(c, done.output_file_id), results(c, done.error_file_id)
        assert sorted(r["custom_id"] for r in out + err) == [f"line-{i}" for i in range(5)]
        assert len(out) == 2 and done.request_counts.completed == 2
        assert {r["error"]["code"] for r in err} == {"batch_cancelled"}
        assert c.batches.cancel(batch.id).status == "cancelled"  # again: no change
        c.files.delete(fid)  # it has ended: its input may go
    finally:
        gate.open(5)  # nothing stays blocked at the gate when the server stops
        assert server.stop() == 0


def test_no_space_left_refuses_an_upload_at_its_head(tmp_path: Path) -> None:
    env = {"ZEROSERVE_BATCH__MIN_FREE_BYTES": str(1 << 62)}
    server = start_server("--model", "echo", "--data-dir", str(tmp_path / "data"), env=env)
    try:
        with pytest.raises(openai.APIStatusError) as refused:
            upload(server.client(), jsonl(completion_lines(1, "echo")))
        assert refused.value.status_code == 507
        assert refused.value.body["code"] == "insufficient_storage"  # type: ignore[index]
        assert httpx.get(server.url + "/v1/files").json()["data"] == []
    finally:
        assert server.stop() == 0
