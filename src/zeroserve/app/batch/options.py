"""The Batch API's options and limits: each a named constant with its unit and reason."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from ...runtime.classes import BATCH_PRIORITY as CLASS_BATCH_PRIORITY

# The priority of every batch line (vLLM's ``priority``: an integer, lower runs first) is
# the lowest class, so interactive work goes first (docs/architecture.md, "The Batch API");
# the runner also bounds its own lines (``LINES_PER_MODEL``, ``LINES_BESIDE_INTERACTIVE``).
BATCH_PRIORITY = CLASS_BATCH_PRIORITY

# A batch input file, bytes: OpenAI's own limit for a batch file is 200 MB; ours is below
# the server's default body limit (128 MiB), which the upload must also pass.
MAX_FILE_BYTES = 100 * 1024 * 1024
# Requests in one batch: OpenAI's limit.
MAX_LINES = 50_000
# One line of an input file, bytes: a 64 KB prompt with room for its JSON; longer lines are
# refused at upload, naming the line.
MAX_LINE_BYTES = 1024 * 1024
# Batches a key may have that have not ended (validating, in_progress, finalizing,
# cancelling): a client cannot queue unbounded work.
MAX_OPEN_BATCHES = 100
# Disk space that must stay free under --data-dir, bytes: an upload or a batch (whose
# results are written beside its input) is refused below it.
MIN_FREE_BYTES = 256 * 1024 * 1024
# How long a batch may take: OpenAI's only window.
COMPLETION_WINDOW = "24h"
COMPLETION_WINDOW_S = 24 * 3600
# Lines of batches in flight per model while no interactive request is: enough to keep a
# few engine slots busy, and few enough that an interactive request that arrives waits
# behind at most this many lines.
LINES_PER_MODEL = 4
# Lines queued per model beyond ``lines_per_model`` while no interactive request is, so
# the next line already waits in the engine's queue when a slot frees (interactive
# requests still go first: the engine's queue orders by class). Off by default: measured,
# it did not raise a batch's throughput within this machine's noise, and queued lines run
# after a cancel (docs/decisions/0054-batch-leases-and-queued-lines.md).
LINES_QUEUED = 0
# Lines in flight per model while interactive requests are admitted on it: one, so the
# batch still advances and yields the rest at once.
LINES_BESIDE_INTERACTIVE = 1
# Lines read from the store per scheduling pass (the window the runner picks from).
SCHEDULE_WINDOW = 64
# A runner's lease on a batch, seconds: several worker processes share a data directory,
# and exactly one runs a batch; a worker killed with its lease leaves it to another this
# long after its last renewal (or at once, when its pid is seen gone on this host).
LEASE_S = 5.0
# How often a runner renews its leases, and the longest it goes without reading a
# batch's status (a cancel through another worker is seen within this), seconds.
LEASE_RENEW_S = 1.0


@dataclass(frozen=True, slots=True)
class BatchOptions:
    """Where the Batch API keeps its state (``data_dir``), its limits, and its clock
    (``wall``: epoch seconds, for the objects' times and the completion window)."""

    data_dir: Path
    max_file_bytes: int = MAX_FILE_BYTES
    max_lines: int = MAX_LINES
    max_line_bytes: int = MAX_LINE_BYTES
    max_open_batches: int = MAX_OPEN_BATCHES
    min_free_bytes: int = MIN_FREE_BYTES
    lines_per_model: int = LINES_PER_MODEL
    lines_queued: int = LINES_QUEUED
    wall: Callable[[], float] = time.time
