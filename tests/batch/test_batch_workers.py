"""``--data-dir`` with ``--workers`` > 1 is refused at startup with the reason: one
process runs a data directory's batches (docs/architecture.md, "The Batch API"); several
worker processes sharing it is not built."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.support import scaled


def test_a_data_dir_with_several_workers_is_refused_with_why(tmp_path: Path) -> None:
    argv = [sys.executable, "-m", "zeroserve", "serve", "--model", "echo", "--port", "0",
            "--host", "127.0.0.1", "--workers", "2", "--data-dir", str(tmp_path / "data")]  # fmt: skip
    done = subprocess.run(argv, capture_output=True, text=True, timeout=scaled(60))
    assert done.returncode != 0
    assert "key 'data_dir': needs workers = 1" in done.stderr
    assert "would run every line again" in done.stderr
    assert not (tmp_path / "data").exists()  # refused before anything was created
