"""What a batch line's commit costs the event loop (docs/decisions/0038-batch-line-commits.md):
5,000 lines inserted at once, then each one's result committed alone, with SQLite's
``synchronous=NORMAL`` (what the store uses) and ``FULL``.

Run: ``python tools/batch_commit_cost.py [DIR]`` (DIR: where the database goes, default
the system's temporary directory: put it on the disk a data directory would use)."""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

from zeroserve.app.batch import schemas as s
from zeroserve.app.batch.store import BatchStore, NewLine

LINES = 5000


def measure(directory: str | None, synchronous: str) -> tuple[float, float]:
    """(seconds to insert every line, seconds per line's result commit)."""
    with tempfile.TemporaryDirectory(dir=directory) as d:
        store = BatchStore(Path(d))
        try:
            store.set_synchronous(synchronous)
            fid, part = store.part_path()
            part.write_bytes(b"{}\n")
            source = store.add_file(fid, part, "", "in.jsonl", "batch", LINES)
            create = s.BatchCreate(
                input_file_id=fid, endpoint="/v1/completions", completion_window="24h"
            )
            batch = store.create_batch("", create, source)
            body = b'{"model":"echo","prompt":"' + b"x" * 200 + b'"}'
            t = time.perf_counter()
            store.start(batch.id, (NewLine(f"c{i}", body) for i in range(LINES)))
            inserted = time.perf_counter() - t
            result = b"r" * 600  # about one chat completion's answer line
            t = time.perf_counter()
            for i in range(LINES):
                store.finish_line(batch.id, i, result, True)
            return inserted, (time.perf_counter() - t) / LINES
        finally:
            store.close()


if __name__ == "__main__":
    where = sys.argv[1] if len(sys.argv) > 1 else None
    for mode in ("NORMAL", "FULL"):
        inserted, per_line = measure(where, mode)
        print(
            f"synchronous={mode}: insert {LINES} lines {inserted * 1e3:.0f} ms; "
            f"a line's commit {per_line * 1e6:.0f} us"
        )
