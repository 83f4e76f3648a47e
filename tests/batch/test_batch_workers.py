"""``--data-dir`` with ``--workers 2``: the worker processes share the SQLite store and the
files, any worker answers any Files/Batch route, and one runner (the lease's holder) runs
a batch; a holder killed with SIGKILL leaves its batch to another runner, and every
``custom_id`` is still in the output once (docs/batch.md, "Several workers")."""

from __future__ import annotations

import os
import signal
import sqlite3
from collections import Counter
from pathlib import Path

from tests.batch.conftest import Gate, completion_lines, gated_batch, jsonl, results, upload
from tests.support import start_server, wait_until

GATED = "gated=tests.support.models.batch:PipeGated"
ENDED = ("completed", "failed", "expired", "cancelled")


def _holder(data: Path, batch_id: str) -> str | None:
    """The runner holding ``batch_id``'s lease, read from the store as any client of the
    database would (``host/pid/nonce``)."""
    db = sqlite3.connect(f"file:{data / 'batches.sqlite3'}?mode=ro", uri=True, timeout=5)
    try:
        row = db.execute("SELECT holder FROM leases WHERE batch_id = ?", (batch_id,)).fetchone()
    finally:
        db.close()
    return None if row is None else str(row[0])


def test_two_workers_share_files_and_batches_and_run_each_line_once(tmp_path: Path) -> None:
    server = start_server("--model", "echo", "--workers", "2", "--data-dir", str(tmp_path / "d"))
    try:
        n = 40
        fid = upload(server.client(), jsonl(completion_lines(n, "echo")))
        # Fresh clients, fresh connections: each lands on either worker (SO_REUSEPORT).
        assert server.client().files.retrieve(fid).bytes > 0
        batch = server.client().batches.create(
            input_file_id=fid, endpoint="/v1/completions", completion_window="24h"
        )
        assert any(b.id == batch.id for b in server.client().batches.list())
        wait_until(
            lambda: server.client().batches.retrieve(batch.id).status in ENDED,
            60,
            "the batch ended",
            interval=0.05,
        )
        done = server.client().batches.retrieve(batch.id)
        assert done.status == "completed"
        assert done.request_counts is not None
        assert (done.request_counts.completed, done.request_counts.failed) == (n, 0)
        ids = Counter(r["custom_id"] for r in results(server.client(), done.output_file_id))
        assert ids == Counter(f"line-{i}" for i in range(n))  # each exactly once
    finally:
        assert server.stop() == 0


def test_sigkill_of_the_running_worker_leaves_the_batch_to_another(
    tmp_path: Path, gate: Gate
) -> None:
    data = tmp_path / "d"
    lines = 6
    server = start_server("--model", GATED, "--workers", "2", "--data-dir", str(data), env=gate.env)
    try:
        _, batch = gated_batch(server.client(), gate, lines, 2)
        holder = _holder(data, batch.id)
        assert holder is not None
        pid = int(holder.split("/")[1])
        assert pid != server.proc.pid  # a worker, not the supervisor
        finished_before = gate.log("finished")
        assert len(finished_before) == 2
        os.kill(pid, signal.SIGKILL)  # mid-batch: four lines are pending or at the gate
        # Another runner (the other worker, or the restarted one) takes the lease over.
        wait_until(
            lambda: (_holder(data, batch.id) or holder) != holder,
            60,
            "another runner holds the batch",
            interval=0.05,
        )
        gate.open(lines)  # enough for every line left (extra bytes stay in the pipe)
        wait_until(
            lambda: server.client().batches.retrieve(batch.id).status in ENDED,
            60,
            "the batch ended after the kill",
            interval=0.05,
        )
        done = server.client().batches.retrieve(batch.id)
        assert done.status == "completed"
        assert done.request_counts is not None
        assert (done.request_counts.completed, done.request_counts.failed) == (lines, 0)
        out = results(server.client(), done.output_file_id)
        assert Counter(r["custom_id"] for r in out) == Counter(
            f"line-{i}" for i in range(lines)
        )  # each exactly once
        # The two lines committed before the kill did not run again.
        finished = Counter(gate.log("finished"))
        assert all(finished[w] == 1 for w in finished_before)
    finally:
        server.stop()
