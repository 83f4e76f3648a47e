"""A batch cancelled through one ``--workers`` process while another runs it: the runner
sees the cancel by reading the batch's status again on its own (each lease renewal,
every second: docs/batch.md, "Several workers"), with no line ending to wake it, and
ends the batch ``cancelled`` with none of its lines run."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import httpx
from openai.types import Batch

from tests.batch.conftest import Gate, completion_lines, jsonl, results, upload
from tests.batch.test_batch_workers import _holder
from tests.support import ServerProcess, scaled, start_server, wait_until

GATED = "gated=tests.support.models.batch:PipeGated"


class _Pinned:
    """The openai SDK over one kept-alive connection, so every call reaches one worker;
    ``pid()`` asks that worker who it is (``/v1/stats``)."""

    def __init__(self, server: ServerProcess) -> None:
        self.url = server.url
        self.http = httpx.Client(
            limits=httpx.Limits(max_connections=1, max_keepalive_connections=1),
            timeout=scaled(30),
        )
        self.client = server.client(http_client=self.http)

    def pid(self) -> int:
        return int(self.http.get(self.url + "/v1/stats").json()["process"])

    def close(self) -> None:
        self.http.close()


def _pinned_to(
    server: ServerProcess, wanted: Callable[[int], bool], opened: list[_Pinned]
) -> _Pinned:
    """A pinned client on a worker whose pid is ``wanted``: new connections until one lands
    there (SO_REUSEPORT spreads them)."""

    def attempt() -> _Pinned | None:
        pinned = _Pinned(server)
        opened.append(pinned)
        return pinned if wanted(pinned.pid()) else None

    found = wait_until(attempt, 30, "a connection to the wanted worker")
    assert found is not None
    return found


def _holder_pid(data: Path, batch_id: str) -> int | None:
    holder = _holder(data, batch_id)
    return None if holder is None else int(holder.split("/")[1])


def _create(pinned: _Pinned, prefix: str, n: int) -> Batch:
    fid = upload(pinned.client, jsonl(completion_lines(n, "gated", prefix)))
    return pinned.client.batches.create(
        input_file_id=fid, endpoint="/v1/completions", completion_window="24h"
    )


def test_cancel_through_another_worker_is_seen_without_a_line_ending(
    tmp_path: Path, gate: Gate
) -> None:
    data = tmp_path / "d"
    # One line in flight per worker: while batch X's first line waits at the gate, the
    # worker holding X starts nothing of another batch, nor ends one line of it.
    env = {
        **gate.env,
        "ZEROSERVE_BATCH__LINES_PER_MODEL": "1",
        "ZEROSERVE_BATCH__LINES_QUEUED": "0",
    }
    server = start_server("--model", GATED, "--workers", "2", "--data-dir", str(data), env=env)
    opened: list[_Pinned] = []
    try:
        first = _pinned_to(server, lambda _: True, opened)
        x = _create(first, "x", 3)
        wait_until(lambda: gate.log("started") == ["x-0"], 30, "X's first line at the gate")
        runner = _holder_pid(data, x.id)
        assert runner is not None and runner != server.proc.pid
        on_runner = _pinned_to(server, lambda pid: pid == runner, opened)

        tries: list[str] = []

        def y_on_the_runner() -> Batch | None:
            # Created through the runner, whose runner takes its lease at once; should the
            # other runner's pass win that race, the stray batch waits at its own gate.
            tries.append(f"y{len(tries)}")
            y = _create(on_runner, tries[-1], 4)
            wait_until(lambda: _holder_pid(data, y.id) is not None, 30, "Y's lease taken")
            return y if _holder_pid(data, y.id) == runner else None

        y = wait_until(y_on_the_runner, 60, "a batch Y held by X's runner", interval=0)
        wait_until(
            lambda: on_runner.client.batches.retrieve(y.id).status == "in_progress",
            30,
            "Y validated",
            interval=0.05,
        )
        other = _pinned_to(server, lambda pid: pid != runner, opened)
        assert other.client.batches.cancel(y.id).status == "cancelling"
        assert other.pid() != runner  # the cancel went through the other worker
        # Nothing ends a line (the gate stays shut), nothing wakes X's runner: it finds
        # the cancel by reading Y's status again at its lease renewal.
        wait_until(
            lambda: other.client.batches.retrieve(y.id).status == "cancelled",
            30,
            "Y cancelled by its runner",
            interval=0.05,
        )
        assert gate.log("finished") == []  # no line ended before the runner saw it
        assert _holder_pid(data, x.id) == runner
        prefix = tries[-1]
        assert not [w for w in gate.log("started") if w.startswith(prefix + "-")]
        done = other.client.batches.retrieve(y.id)
        assert done.request_counts is not None
        assert (done.request_counts.completed, done.request_counts.failed) == (0, 4)
        err = results(other.client, done.error_file_id)
        assert sorted(r["custom_id"] for r in err) == [f"{prefix}-{i}" for i in range(4)]
        assert {r["error"]["code"] for r in err} == {"batch_cancelled"}
        # X goes on: its lines finish once the gate lets them.
        gate.open(64)
        wait_until(
            lambda: first.client.batches.retrieve(x.id).status == "completed",
            30,
            "X completed",
            interval=0.05,
        )
    finally:
        gate.open(64)  # nothing stays blocked at the gate when the server stops
        for pinned in opened:
            pinned.close()
        assert server.stop() == 0
