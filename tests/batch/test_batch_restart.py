"""A batch survives its server: killed with SIGKILL in the middle of a batch, the server
resumes it after a restart on the same ``--data-dir``; every ``custom_id`` is in the output
once, and no line that had finished runs again (docs/architecture.md, "The Batch API").
The gated model (``tests.support.models.batch.PipeGated``) finishes one generation per byte the test
writes, so the test decides how far the batch is when it kills the server."""

from __future__ import annotations

import signal
from collections import Counter
from pathlib import Path

from tests.batch.conftest import Gate, gated_batch, results
from tests.support import start_server, wait_until

MODEL = "gated=tests.support.models.batch:PipeGated"
LINES = 6


def test_sigkill_mid_batch_resumes_without_running_a_finished_line(
    tmp_path: Path, gate: Gate
) -> None:
    data = tmp_path / "data"
    args = ("--model", MODEL, "--data-dir", str(data))
    server = start_server(*args, env=gate.env)
    try:
        c = server.client()
        _, batch = gated_batch(c, gate, LINES, 2)
        # A third line is running (blocked at the gate) when the server dies.
        wait_until(lambda: len(gate.log("started")) >= 3, 30, "third started", interval=0.05)
        finished_before = gate.log("finished")
        assert len(finished_before) == 2
    finally:
        server.stop(signal.SIGKILL)

    server = start_server(*args, env=gate.env)
    try:
        c = server.client()
        assert c.batches.retrieve(batch.id).status == "in_progress"
        gate.open(LINES - 2)
        wait_until(
            lambda: c.batches.retrieve(batch.id).status == "completed",
            30,
            "the batch completed after the restart",
            interval=0.05,
        )
        done = c.batches.retrieve(batch.id)
        assert done.request_counts is not None
        assert (done.request_counts.total, done.request_counts.completed) == (LINES, LINES)
        assert done.request_counts.failed == 0 and done.error_file_id is None
        out = results(c, done.output_file_id)
        ids = [r["custom_id"] for r in out]
        assert sorted(ids) == sorted(f"line-{i}" for i in range(LINES))  # each exactly once
        assert all(r["response"]["status_code"] == 200 for r in out)
        # Nothing that had finished ran again: each prompt finished exactly once overall.
        finished = Counter(gate.log("finished"))
        assert finished == Counter(f"line-{i}" for i in range(LINES))
        # The line in flight at the kill started twice: it was run again, not lost.
        assert len(gate.log("started")) > LINES
    finally:
        assert server.stop() == 0
