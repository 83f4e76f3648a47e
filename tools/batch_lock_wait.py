"""How long the event loop's writes wait for another worker's write lock
(docs/decisions/0054-batch-leases-and-queued-lines.md): one process validates a
50,000-line batch into a store (``BatchStore.start``, ``START_CHUNK`` lines a
transaction) while this one makes a line commit and a lease renewal every 2 ms on its
own connection, as a worker's loop does, with the store's ``LOOP_BUSY_S``; each write's
time, and how many ran out of the busy wait (then retried by their callers).

Run: ``python tools/batch_lock_wait.py [DIR]`` (DIR: where the database goes)."""

from __future__ import annotations

import multiprocessing
import os
import sqlite3
import sys
import tempfile
import time
from pathlib import Path

from zeroserve.app.batch.store import LOOP_BUSY_S, START_CHUNK, BatchStore, NewLine

LINES = 50_000
BODY = b'{"model": "m", "prompt": "' + b"y" * 200 + b'"}'


def _validate(directory: str) -> None:
    store = BatchStore(Path(directory))
    store.start("batch_v", (NewLine(f"c{i}", BODY) for i in range(LINES)))


def main() -> None:
    directory = tempfile.mkdtemp(dir=sys.argv[1] if len(sys.argv) > 1 else None)
    store = BatchStore(Path(directory))
    store.start("batch_b", [NewLine("c", BODY)])
    store.take_lease("batch_b", "me", 3600)
    other = multiprocessing.Process(target=_validate, args=(directory,))
    other.start()
    waits: list[float] = []
    failed = 0
    while other.is_alive():
        t0 = time.perf_counter()
        try:
            store.finish_line("batch_b", 0, b"r" * 600, True, "me")
            store.take_lease("batch_b", "me", 3600)
        except sqlite3.OperationalError:
            failed += 1
        waits.append(time.perf_counter() - t0)
        time.sleep(0.002)
    other.join()
    waits.sort()
    print(
        f"{len(waits)} loop writes while another process validated {LINES:,} lines "
        f"({START_CHUNK} a transaction; busy wait {LOOP_BUSY_S * 1e3:.0f} ms): "
        f"p50 {waits[len(waits) // 2] * 1e3:.1f} ms, p99 {waits[int(len(waits) * 0.99)] * 1e3:.1f}"
        f" ms, max {waits[-1] * 1e3:.1f} ms; {failed} ran out of the busy wait; "
        f"load average {os.getloadavg()[0]:.1f}"
    )


if __name__ == "__main__":
    main()
