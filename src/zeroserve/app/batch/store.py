"""The Batch API's durable state: one SQLite database (the stdlib module, WAL mode) and
the files beside it, under ``--data-dir`` (docs/architecture.md, "The Batch API").

Invariants
----------
* A file is on disk under its id before its row is committed (written to ``*.part``,
  then renamed): a row always names a whole file. A file without a row (the process died
  between the rename and the commit) is removed at start.
* A batch's lines are inserted (off the loop, in chunks) before the transaction that
  moves it from ``validating`` to ``in_progress``; nothing reads them before that, and a
  batch validated again replaces them. A line's result is committed in the same statement
  that marks it done, so after a crash (SIGKILL included) a line is either done, with
  its one result, or pending, and run again: every ``custom_id`` ends up once in the
  output, and nothing finished runs again.
* The output and error files are written from those results in line order when the batch
  finalizes; the commit that ends the batch adds their rows and drops its lines.

Every call is short and synchronous (a statement or one small transaction, in WAL mode
with ``synchronous=NORMAL``: a commit survives the process being killed, though not a
power cut), except ``start``, which a thread runs; the runner and the routes call it
from the event loop: a line's commit costs
it about 50 us, where ``FULL``'s fsync would stall it for milliseconds
(docs/decisions/0038-batch-line-commits.md).
"""

from __future__ import annotations

import secrets
import shutil
import sqlite3
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec

from ...errors import NotFound, RequestError, ZeroserveError
from . import schemas as s
from .options import COMPLETION_WINDOW, COMPLETION_WINDOW_S

_SCHEMA = """
CREATE TABLE IF NOT EXISTS files (
    id TEXT PRIMARY KEY, owner TEXT NOT NULL, bytes INTEGER NOT NULL,
    created_at INTEGER NOT NULL, filename TEXT NOT NULL, purpose TEXT NOT NULL,
    lines INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS batches (
    id TEXT PRIMARY KEY, owner TEXT NOT NULL, endpoint TEXT NOT NULL,
    input_file_id TEXT NOT NULL, completion_window TEXT NOT NULL, status TEXT NOT NULL,
    created_at INTEGER NOT NULL, in_progress_at INTEGER, expires_at INTEGER,
    finalizing_at INTEGER, completed_at INTEGER, failed_at INTEGER, expired_at INTEGER,
    cancelling_at INTEGER, cancelled_at INTEGER, output_file_id TEXT, error_file_id TEXT,
    errors TEXT, metadata TEXT, total INTEGER NOT NULL DEFAULT 0,
    completed INTEGER NOT NULL DEFAULT 0, failed INTEGER NOT NULL DEFAULT 0
);
CREATE INDEX IF NOT EXISTS batches_owner ON batches (owner, created_at, id);
CREATE TABLE IF NOT EXISTS lines (
    batch_id TEXT NOT NULL, idx INTEGER NOT NULL, custom_id TEXT, body BLOB,
    done INTEGER NOT NULL DEFAULT 0, ok INTEGER NOT NULL DEFAULT 0, result BLOB,
    PRIMARY KEY (batch_id, idx)
);
CREATE TABLE IF NOT EXISTS leases (
    batch_id TEXT PRIMARY KEY, holder TEXT NOT NULL, until REAL NOT NULL
);
"""
_BATCH_COLUMNS = (
    "id, owner, endpoint, input_file_id, completion_window, status, created_at, "
    "in_progress_at, expires_at, finalizing_at, completed_at, failed_at, expired_at, "
    "cancelling_at, cancelled_at, output_file_id, error_file_id, errors, metadata, "
    "total, completed, failed"
)
_DB_NAME = "batches.sqlite3"
# Lines per transaction of a validated batch's insert (``BatchStore.start``): about 15 ms
# of the write lock each on the development machine, the longest the loop's own
# statements wait behind it.
START_CHUNK = 1000
# How long the validating thread's statements wait for another connection's write lock
# before failing, seconds (off the loop: waiting there stalls nothing else).
_BUSY_S = 30.0
# The same wait for the connection the event loop uses. Several worker processes share
# the database (docs/batch.md), so a loop write may wait for another process's write
# lock, and on a loaded machine that wait was measured at up to 0.5 s (another process
# validating 50,000 lines, load average 14: docs/decisions/0054-batch-leases-and-queued-lines.md).
# This bounds how long the loop can stall there; past it the statement fails with
# ``sqlite3.OperationalError`` and its caller retries off the wait: a line's commit after
# an ``asyncio.sleep``, the runner's pass a second later, a route answers 503.
LOOP_BUSY_S = 0.05
# Files younger than this, seconds, are never collected as orphans at start: another
# worker sharing the directory may be writing them (an upload's ``.part``) or about to
# commit their row (between the rename and the insert).
ORPHAN_AGE_S = 600.0
_INSERT_LINE = (
    "INSERT INTO lines (batch_id, idx, custom_id, body, done, ok, result) "
    "VALUES (?, ?, ?, ?, ?, 0, ?)"
)
_errors_decoder = msgspec.json.Decoder(s.BatchErrors)
_metadata_decoder = msgspec.json.Decoder(dict[str, str])
# A batch line as the store keeps it before it runs: (index, custom_id, body bytes).
PendingLine = tuple[int, str | None, bytes]


@dataclass(frozen=True, slots=True)
class FileRow:
    id: str
    owner: str
    bytes: int
    created_at: int
    filename: str
    purpose: str
    lines: int

    def public(self) -> s.FileObject:
        return s.FileObject(
            id=self.id,
            bytes=self.bytes,
            created_at=self.created_at,
            filename=self.filename,
            purpose=self.purpose,
        )


@dataclass(frozen=True, slots=True)
class NewLine:
    """A line as validation leaves it: to run (``result`` None) or already failed."""

    custom_id: str | None
    body: bytes | None
    result: bytes | None = None


def _insert_lines(
    db: sqlite3.Connection, rows: list[tuple[str, int, str | None, bytes | None, int, bytes | None]]
) -> None:
    db.execute("BEGIN IMMEDIATE")
    try:
        db.executemany(_INSERT_LINE, rows)
        db.execute("COMMIT")
    except BaseException:
        db.execute("ROLLBACK")
        raise


def _new_id(prefix: str) -> str:
    return prefix + secrets.token_hex(12)


class BatchStore:
    """The database and the files of one data directory. ``clock``: epoch seconds."""

    def __init__(self, data_dir: Path, clock: Callable[[], float] = time.time) -> None:
        self.data_dir = data_dir
        self.files_dir = data_dir / "files"
        self.files_dir.mkdir(parents=True, exist_ok=True)
        self._clock = clock
        self._db = sqlite3.connect(data_dir / _DB_NAME, isolation_level=None, timeout=_BUSY_S)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute(f"PRAGMA busy_timeout={int(LOOP_BUSY_S * 1000)}")
        self._db.execute("PRAGMA synchronous=NORMAL")
        self._db.executescript(_SCHEMA)
        self._collect_orphans()

    def set_synchronous(self, mode: str) -> None:
        """SQLite's ``synchronous`` (``NORMAL`` by default; ``FULL`` to measure it:
        docs/decisions/0038-batch-line-commits.md)."""
        assert mode in ("NORMAL", "FULL")
        self._db.execute(f"PRAGMA synchronous={mode}")

    def now(self) -> int:
        return int(self._clock())

    def close(self) -> None:
        self._db.close()

    def _collect_orphans(self) -> None:
        """Remove what a killed process left: partial writes and files with no row, once
        older than ``ORPHAN_AGE_S`` (a live worker's may be young)."""
        known = {row[0] for row in self._db.execute("SELECT id FROM files")}
        old = time.time() - ORPHAN_AGE_S
        for path in self.files_dir.iterdir():
            if path.suffix == ".part" or path.name not in known:
                try:
                    if path.stat().st_mtime < old:
                        path.unlink(missing_ok=True)
                except FileNotFoundError:
                    pass

    # -- space -----------------------------------------------------------------------------
    def check_space(self, needed: int, min_free: int) -> None:
        """Refuse work that would leave less than ``min_free`` bytes free on the disk."""
        free = shutil.disk_usage(self.data_dir).free
        if free - needed < min_free:
            raise ZeroserveError(
                "not enough disk space left under the data directory for this request",
                status=507,
                code="insufficient_storage",
            )

    # -- files -----------------------------------------------------------------------------
    def part_path(self) -> tuple[str, Path]:
        """A new file id and the path its bytes are written to before they are whole."""
        fid = _new_id("file-")
        return fid, self.files_dir / f"{fid}.part"

    def upload_path(self) -> Path:
        """Where an upload's form is written as it arrives (removed once read)."""
        return self.files_dir / f"upload-{secrets.token_hex(12)}.part"

    def path(self, fid: str) -> Path:
        return self.files_dir / fid

    def add_file(
        self, fid: str, part: Path, owner: str, filename: str, purpose: str, lines: int
    ) -> FileRow:
        """Commit a file whose bytes are whole at ``part``."""
        size = part.stat().st_size
        part.rename(self.path(fid))
        row = FileRow(fid, owner, size, self.now(), filename, purpose, lines)
        self._db.execute(
            "INSERT INTO files VALUES (?, ?, ?, ?, ?, ?, ?)",
            (row.id, row.owner, row.bytes, row.created_at, row.filename, row.purpose, lines),
        )
        return row

    def file(self, fid: str, owner: str) -> FileRow:
        """The file ``fid`` of ``owner``: another key's file is as unknown as none (404)."""
        found = self._db.execute(
            "SELECT id, owner, bytes, created_at, filename, purpose, lines FROM files "
            "WHERE id = ? AND owner = ?",
            (fid, owner),
        ).fetchone()
        if found is None:
            raise NotFound("no such file", code="file_not_found", param="file_id")
        return FileRow(*found)

    def files(self, owner: str) -> list[FileRow]:
        rows = self._db.execute(
            "SELECT id, owner, bytes, created_at, filename, purpose, lines FROM files "
            "WHERE owner = ? ORDER BY created_at, id",
            (owner,),
        )
        return [FileRow(*r) for r in rows]

    def delete_file(self, fid: str, owner: str) -> None:
        row = self.file(fid, owner)
        busy = self._db.execute(
            "SELECT 1 FROM batches WHERE input_file_id = ? AND status NOT IN "
            "('failed', 'completed', 'expired', 'cancelled')",
            (row.id,),
        ).fetchone()
        if busy is not None:
            raise RequestError(
                "the file is the input of a batch that has not ended", param="file_id"
            )
        self._db.execute("DELETE FROM files WHERE id = ?", (row.id,))
        self.path(row.id).unlink(missing_ok=True)

    # -- batches ---------------------------------------------------------------------------
    def create_batch(self, owner: str, req: s.BatchCreate, source: FileRow) -> s.BatchObject:
        now = self.now()
        bid = _new_id("batch_")
        meta = None if req.metadata is None else s.encoder.encode(req.metadata).decode()
        self._db.execute(
            "INSERT INTO batches (id, owner, endpoint, input_file_id, completion_window, "
            "status, created_at, expires_at, metadata, total) "
            "VALUES (?, ?, ?, ?, ?, 'validating', ?, ?, ?, ?)",
            (bid, owner, req.endpoint, source.id, req.completion_window, now,
             now + _window_s(req.completion_window), meta, source.lines),
        )  # fmt: skip
        return self.batch(bid, owner)

    def open_count(self, owner: str) -> int:
        (n,) = self._db.execute(
            "SELECT count(*) FROM batches WHERE owner = ? AND status NOT IN "
            "('failed', 'completed', 'expired', 'cancelled')",
            (owner,),
        ).fetchone()
        return int(n)

    def batch(self, bid: str, owner: str | None) -> s.BatchObject:
        """Batch ``bid`` of ``owner`` (None: any owner, for the runner); else 404."""
        if owner is None:
            cur = self._db.execute(f"SELECT {_BATCH_COLUMNS} FROM batches WHERE id = ?", (bid,))
        else:
            cur = self._db.execute(
                f"SELECT {_BATCH_COLUMNS} FROM batches WHERE id = ? AND owner = ?", (bid, owner)
            )
        found = cur.fetchone()
        if found is None:
            raise NotFound("no such batch", code="batch_not_found", param="batch_id")
        return self._public(found)

    def batches(
        self, owner: str, after: str | None, limit: int
    ) -> tuple[list[s.BatchObject], bool]:
        """``owner``'s batches, newest first, after batch ``after`` (OpenAI's cursor);
        whether more follow."""
        if after is None:
            rows = self._db.execute(
                f"SELECT {_BATCH_COLUMNS} FROM batches WHERE owner = ? "
                "ORDER BY created_at DESC, id DESC LIMIT ?",
                (owner, limit + 1),
            ).fetchall()
        else:
            cursor = self._db.execute(
                "SELECT created_at, id FROM batches WHERE id = ? AND owner = ?", (after, owner)
            ).fetchone()
            if cursor is None:
                raise NotFound("no such batch to list after", code="batch_not_found", param="after")
            rows = self._db.execute(
                f"SELECT {_BATCH_COLUMNS} FROM batches WHERE owner = ? AND "
                "(created_at < ? OR (created_at = ? AND id < ?)) "
                "ORDER BY created_at DESC, id DESC LIMIT ?",
                (owner, cursor[0], cursor[0], cursor[1], limit + 1),
            ).fetchall()
        return [self._public(r) for r in rows[:limit]], len(rows) > limit

    def open_batches(self) -> list[s.BatchObject]:
        """Every batch that has not ended, oldest first (what the runner works on)."""
        rows = self._db.execute(
            f"SELECT {_BATCH_COLUMNS} FROM batches WHERE status NOT IN "
            "('failed', 'completed', 'expired', 'cancelled') ORDER BY created_at, id"
        )
        return [self._public(r) for r in rows]

    def owner_of(self, bid: str) -> str:
        (owner,) = self._db.execute("SELECT owner FROM batches WHERE id = ?", (bid,)).fetchone()
        return str(owner)

    def cancel(self, bid: str, owner: str) -> s.BatchObject:
        batch = self.batch(bid, owner)
        if batch.status in ("validating", "in_progress"):
            self._db.execute(
                "UPDATE batches SET status = 'cancelling', cancelling_at = ? WHERE id = ?",
                (self.now(), bid),
            )
        elif batch.status not in ("cancelling", "cancelled"):
            raise RequestError(
                f"a batch that is {batch.status} cannot be cancelled", code="invalid_state"
            )
        return self.batch(bid, owner)

    def fail(self, bid: str, errors: list[s.BatchError]) -> None:
        self._db.execute(
            "UPDATE batches SET status = 'failed', failed_at = ?, errors = ? WHERE id = ?",
            (self.now(), s.encoder.encode(s.BatchErrors(data=errors)).decode(), bid),
        )

    def start(self, bid: str, lines: Iterable[NewLine], chunk: int = START_CHUNK) -> None:
        """Validated: insert the lines, then move to ``in_progress``. Called off the event
        loop (a thread) with a connection of its own: the lines go in ``chunk`` at a time,
        each chunk a short transaction (so the loop's own statements wait at most one
        chunk for the write lock), and the runner sees none of them until the last
        transaction moves the batch on. A crash before then leaves a ``validating`` batch
        that is validated again from the start (its lines are replaced). ``lines`` may
        raise (a duplicate ``custom_id``): the lines inserted are removed."""
        db = sqlite3.connect(self.data_dir / _DB_NAME, isolation_level=None, timeout=_BUSY_S)
        try:
            db.execute("DELETE FROM lines WHERE batch_id = ?", (bid,))
            total = 0
            rows: list[tuple[str, int, str | None, bytes | None, int, bytes | None]] = []
            try:
                for line in lines:
                    rows.append(
                        (
                            bid,
                            total,
                            line.custom_id,
                            line.body,
                            int(line.result is not None),
                            line.result,
                        )
                    )
                    total += 1
                    if len(rows) >= chunk:
                        _insert_lines(db, rows)
                        rows = []
            except BaseException:
                db.execute("DELETE FROM lines WHERE batch_id = ?", (bid,))
                raise
            db.execute("BEGIN IMMEDIATE")
            try:
                if rows:
                    db.executemany(_INSERT_LINE, rows)
                db.execute(
                    "UPDATE batches SET status = CASE status WHEN 'validating' THEN "
                    "'in_progress' ELSE status END, in_progress_at = ?, total = ? WHERE id = ?",
                    (self.now(), total, bid),
                )
                db.execute("COMMIT")
            except BaseException:
                db.execute("ROLLBACK")
                raise
        finally:
            db.close()

    def pending(self, bid: str, limit: int, skip: frozenset[int] | set[int]) -> list[PendingLine]:
        """Up to ``limit`` lines not done and not in ``skip`` (in flight), in order."""
        rows = self._db.execute(
            "SELECT idx, custom_id, body FROM lines WHERE batch_id = ? AND done = 0 "
            "ORDER BY idx LIMIT ?",
            (bid, limit + len(skip)),
        )
        out = [(int(i), c, bytes(b)) for i, c, b in rows if i not in skip]
        return out[:limit]

    def finish_line(self, bid: str, idx: int, result: bytes, ok: bool, holder: str) -> bool:
        """Line ``idx`` is done: its result, committed with the mark, only while the line
        is pending and ``holder`` holds the batch's lease (one statement: two runners can
        never both commit a line). Whether it was committed."""
        cur = self._db.execute(
            "UPDATE lines SET done = 1, ok = ?, result = ?, body = NULL "
            "WHERE batch_id = ? AND idx = ? AND done = 0 AND EXISTS (SELECT 1 FROM leases "
            "WHERE batch_id = ? AND holder = ? AND until > ?)",
            (int(ok), result, bid, idx, bid, holder, time.time()),
        )
        return cur.rowcount == 1

    # -- leases: which worker runs a batch -------------------------------------------------
    def take_lease(self, bid: str, holder: str, ttl: float, dead: str | None = None) -> bool:
        """Take or renew batch ``bid``'s lease for ``ttl`` seconds: granted when no one
        holds it, ``holder`` does, it has expired, or its holder is ``dead`` (known gone).
        One conditional upsert, atomic in SQLite. Whether ``holder`` now holds it."""
        now = time.time()
        cur = self._db.execute(
            "INSERT INTO leases (batch_id, holder, until) VALUES (?, ?, ?) "
            "ON CONFLICT (batch_id) DO UPDATE SET holder = excluded.holder, "
            "until = excluded.until WHERE leases.holder = excluded.holder "
            "OR leases.until <= ? OR leases.holder = ?",
            (bid, holder, now + ttl, now, dead),
        )
        return cur.rowcount == 1

    def lease(self, bid: str) -> tuple[str, float] | None:
        """(holder, until in epoch seconds) of batch ``bid``'s lease, if any."""
        row = self._db.execute(
            "SELECT holder, until FROM leases WHERE batch_id = ?", (bid,)
        ).fetchone()
        return None if row is None else (str(row[0]), float(row[1]))

    def release_lease(self, bid: str, holder: str) -> None:
        self._db.execute("DELETE FROM leases WHERE batch_id = ? AND holder = ?", (bid, holder))

    def lease_clock(self) -> float:
        """The leases' clock: epoch seconds, shared by every process on the host (never
        the injected ``clock``, which is the batches' window)."""
        return time.time()

    def counts(self, bid: str) -> tuple[int, int, int]:
        """(done ok, done failed, pending) of a batch's lines."""
        ok = failed = pending = 0
        for done, good, n in self._db.execute(
            "SELECT done, ok, count(*) FROM lines WHERE batch_id = ? GROUP BY done, ok", (bid,)
        ):
            if not done:
                pending += n
            elif good:
                ok += n
            else:
                failed += n
        return ok, failed, pending

    def set_finalizing(self, bid: str) -> None:
        self._db.execute(
            "UPDATE batches SET status = 'finalizing', finalizing_at = ? "
            "WHERE id = ? AND status = 'in_progress'",
            (self.now(), bid),
        )

    def results(self, bid: str, ok: bool) -> Iterator[tuple[int, str | None, bytes | None]]:
        """(index, custom_id, result or None for a line never done), in line order."""
        rows = self._db.execute(
            "SELECT idx, custom_id, result FROM lines WHERE batch_id = ? AND "
            + ("done = 1 AND ok = 1" if ok else "NOT (done = 1 AND ok = 1)")
            + " ORDER BY idx",
            (bid,),
        )
        for idx, cid, result in rows:
            yield int(idx), cid, None if result is None else bytes(result)

    def end(
        self,
        bid: str,
        status: str,
        outputs: dict[str, tuple[str, Path, int]],
        counts: tuple[int, int],
        holder: str,
    ) -> bool:
        """End a batch: its result files' rows (``outputs``: kind -> (id, whole part
        file, lines)), its final status and counts, and its lines and lease dropped, in
        one transaction, only while ``holder`` holds its lease (else the part files are
        removed). Whether it ended."""
        db = self._db
        owner = self.owner_of(bid)
        now = self.now()
        db.execute("BEGIN IMMEDIATE")
        try:
            held = db.execute(
                "SELECT 1 FROM leases WHERE batch_id = ? AND holder = ? AND until > ?",
                (bid, holder, time.time()),
            ).fetchone()
            if held is None:
                db.execute("ROLLBACK")
                for _, part, _ in outputs.values():
                    part.unlink(missing_ok=True)
                return False
            ids: dict[str, str | None] = {"output": None, "error": None}
            for kind, (fid, part, n) in outputs.items():
                self.add_file(fid, part, owner, f"{bid}_{kind}.jsonl", "batch_output", n)
                ids[kind] = fid
            stamp = {"completed": "completed_at", "cancelled": "cancelled_at"}.get(
                status, "expired_at"
            )
            db.execute(
                f"UPDATE batches SET status = ?, {stamp} = ?, output_file_id = ?, "
                "error_file_id = ?, completed = ?, failed = ? WHERE id = ?",
                (status, now, ids["output"], ids["error"], counts[0], counts[1], bid),
            )
            db.execute("DELETE FROM lines WHERE batch_id = ?", (bid,))
            db.execute("DELETE FROM leases WHERE batch_id = ?", (bid,))
            db.execute("COMMIT")
        except BaseException:
            db.execute("ROLLBACK")
            raise
        return True

    def _public(self, row: tuple[Any, ...]) -> s.BatchObject:
        (bid, _owner, endpoint, input_file_id, window, status, created_at, in_progress_at,
         expires_at, finalizing_at, completed_at, failed_at, expired_at, cancelling_at,
         cancelled_at, output_file_id, error_file_id, errors, metadata, total, completed,
         failed) = row  # fmt: skip
        if str(status) in s.ENDED:
            counts = s.RequestCounts(total=int(total), completed=int(completed), failed=int(failed))
        else:
            ok, bad, _ = self.counts(str(bid))
            counts = s.RequestCounts(total=int(total), completed=ok, failed=bad)
        return s.BatchObject(
            id=str(bid),
            endpoint=str(endpoint),
            errors=None if errors is None else _errors_decoder.decode(str(errors)),
            input_file_id=str(input_file_id),
            completion_window=str(window),
            status=status,
            output_file_id=output_file_id,
            error_file_id=error_file_id,
            created_at=int(created_at),
            in_progress_at=in_progress_at,
            expires_at=expires_at,
            finalizing_at=finalizing_at,
            completed_at=completed_at,
            failed_at=failed_at,
            expired_at=expired_at,
            cancelling_at=cancelling_at,
            cancelled_at=cancelled_at,
            request_counts=counts,
            metadata=None if metadata is None else _metadata_decoder.decode(str(metadata)),
        )


def _window_s(window: str) -> int:
    assert window == COMPLETION_WINDOW, "the create request's decode allows no other window"
    return COMPLETION_WINDOW_S
