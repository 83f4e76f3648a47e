"""A batch validates off the event loop: while its validation is held mid-file, the same
server answers ``/health`` and the batch's own status (docs/architecture.md, "The Batch
API").

The test holds the validation by what it reads: the uploaded file is swapped on disk for
a FIFO the test writes, so the validating thread blocks in ``read`` half-way through the
lines, for as long as the test decides. Were validation on the loop, the loop would be
blocked in that read and ``/health`` would not be answered (the client's bounded timeout
fails the test). No timing is asserted: the order is the proof."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import httpx

from tests.batch.conftest import completion_lines, jsonl, upload
from tests.support import scaled, start_server, wait_until


def _open_writer(fifo: Path) -> int | None:
    """The FIFO's write end once a reader has it open (None: no reader yet)."""
    try:
        return os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
    except OSError as exc:
        if exc.errno == errno.ENXIO:
            return None
        raise


def test_health_is_answered_while_a_batch_validates(tmp_path: Path) -> None:
    data = tmp_path / "data"
    srv = start_server("--model", "echo", "--data-dir", str(data))
    try:
        c = srv.client()
        body = jsonl(completion_lines(200, "echo"))
        fid = upload(c, body)
        path = data / "files" / fid
        assert path.stat().st_size == len(body)
        path.unlink()
        os.mkfifo(path)
        batch = c.batches.create(
            input_file_id=fid, endpoint="/v1/completions", completion_window="24h"
        )
        fd = wait_until(lambda: _open_writer(path), 30, "the validation to open the input")
        half = body.index(b"\n", len(body) // 2) + 1
        try:
            os.set_blocking(fd, True)
            os.write(fd, body[:half])  # the validating thread now waits for the rest
            health = httpx.get(srv.url + "/health", timeout=scaled(10.0))
            assert health.status_code == 200
            assert c.batches.retrieve(batch.id).status == "validating"
            os.write(fd, body[half:])
        finally:
            os.close(fd)
        wait_until(
            lambda: c.batches.retrieve(batch.id).status == "completed",
            60,
            "the batch to complete",
            interval=0.05,
        )
        done = c.batches.retrieve(batch.id)
        assert done.request_counts is not None
        assert (done.request_counts.total, done.request_counts.completed) == (200, 200)
    finally:
        assert srv.stop() == 0
