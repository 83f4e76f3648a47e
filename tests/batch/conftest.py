"""Helpers of the Batch API tests: input files, the openai client, the gate."""

from __future__ import annotations

import io
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest
from openai.types import Batch

from tests.support import wait_until
from tests.support.models.batch import GATE_ENV


def jsonl(lines: list[dict[str, Any]]) -> bytes:
    return b"".join(json.dumps(line).encode() + b"\n" for line in lines)


def completion_lines(n: int, model: str, prefix: str = "line") -> list[dict[str, Any]]:
    return [
        {
            "custom_id": f"{prefix}-{i}",
            "method": "POST",
            "url": "/v1/completions",
            "body": {"model": model, "prompt": f"{prefix}-{i}", "max_tokens": 2},
        }
        for i in range(n)
    ]


def completed(c: openai.OpenAI, batch_id: str) -> int:
    counts = c.batches.retrieve(batch_id).request_counts
    return counts.completed if counts is not None else 0


def gated_batch(c: openai.OpenAI, gate: Gate, lines: int, done: int) -> tuple[str, Batch]:
    """Upload ``lines`` completions of the gated model, start their batch and let ``done`` of
    them finish; return (input file id, batch) once the batch counts them completed."""
    fid = upload(c, jsonl(completion_lines(lines, "gated")))
    batch = c.batches.create(input_file_id=fid, endpoint="/v1/completions", completion_window="24h")
    gate.open(done)
    wait_until(lambda: completed(c, batch.id) == done, 30, f"{done} lines done", interval=0.05)
    return fid, batch


def upload(c: openai.OpenAI, data: bytes, name: str = "in.jsonl") -> str:
    return c.files.create(file=(name, io.BytesIO(data)), purpose="batch").id


def results(c: openai.OpenAI, file_id: str | None) -> list[dict[str, Any]]:
    if file_id is None:
        return []
    return [json.loads(x) for x in c.files.content(file_id).content.splitlines()]


class Gate:
    """The FIFO the gated model reads: ``open(n)`` lets ``n`` generations finish."""

    def __init__(self, directory: Path) -> None:
        self.dir = directory
        os.mkfifo(directory / "gate")
        # Read-write: opening never blocks, and a reader never sees the end of the pipe.
        self._fd = os.open(directory / "gate", os.O_RDWR)
        self.env = {GATE_ENV: str(directory)}

    def open(self, n: int) -> None:
        os.write(self._fd, b"x" * n)

    def log(self, name: str) -> list[str]:
        path = self.dir / name
        return path.read_text().split() if path.exists() else []

    def close(self) -> None:
        os.close(self._fd)


@pytest.fixture
def gate(tmp_path: Path) -> Iterator[Gate]:
    directory = tmp_path / "gate"
    directory.mkdir()
    g = Gate(directory)
    yield g
    g.close()
