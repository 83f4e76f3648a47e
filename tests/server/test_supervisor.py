"""``--workers N``: the supervisor replaces a worker that dies, backs off a worker that
dies at start, exits when no worker ever serves, and stops every worker on SIGTERM
(docs/deploy.md, "Several workers"; ``server/supervisor.py``).

The first tests run the ``WorkerSupervisor`` in the test process over tiny real children (a
few lines of Python each) that play a worker: they make the socket a serving worker
makes, die or stop as the test scripts them. The last runs a real server."""

from __future__ import annotations

import logging
import os
import signal
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest

from tests.support import scaled, start_server, wait_until
from zeroserve.server.supervisor import (
    RESTART_BACKOFF_MAX_S,
    STABLE_S,
    WorkerSupervisor,
    exit_status,
    restart_delay,
)

# A child that serves (its socket), dies by SIGKILL the first time, and the second time
# asks its parent to stop (SIGTERM), then exits 0 on the SIGTERM the parent forwards.
_KILLED_THEN_STOPS = r"""
import os, signal, sys
from pathlib import Path
d = Path(sys.argv[1])
with open(d / "starts", "a") as f:
    f.write(f"{os.getpid()}\n")
(d / f"{os.getpid()}.sock").touch()
if not (d / "killed").exists():
    (d / "killed").touch()
    os.kill(os.getpid(), signal.SIGKILL)
signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
os.kill(os.getppid(), signal.SIGTERM)
while True:
    signal.pause()
"""
# A child that fails before it serves (a model that does not load).
_FAILS_AT_START = r"""
import os, sys
from pathlib import Path
with open(Path(sys.argv[1]) / "starts", "a") as f:
    f.write(f"{os.getpid()}\n")
sys.exit(3)
"""


def _children(pid: int) -> set[int]:
    """The processes ``pid`` started (the supervisor's: its workers), from /proc."""
    return {int(p) for p in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()}


def test_restart_delay_doubles_from_one_second_to_its_cap() -> None:
    assert [restart_delay(n) for n in range(8)] == [0, 1, 2, 4, 8, 16, 30, 30]
    assert restart_delay(10_000) == RESTART_BACKOFF_MAX_S
    assert STABLE_S == 10.0
    assert exit_status(-signal.SIGKILL) == 137 and exit_status(3) == 3


def test_a_dead_worker_is_logged_and_replaced_then_sigterm_stops_it(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    argv = [sys.executable, "-c", _KILLED_THEN_STOPS, str(tmp_path)]
    sup = WorkerSupervisor(argv, dict(os.environ), 1, tmp_path)
    with caplog.at_level(logging.INFO, logger="zeroserve.supervisor"):
        status = sup.run()  # returns when the replacement has asked it to stop
    assert status == 0
    first, second = (int(p) for p in (tmp_path / "starts").read_text().split())
    assert sup.statistics().replaced == 1 and sup.statistics().alive == 0
    text = caplog.text
    assert f"worker {first} was killed by SIGKILL" in text
    assert f"worker {second} started in place of worker {first}" in text
    assert not (tmp_path / f"{first}.sock").exists()  # the dead one's socket is gone


def test_workers_that_all_die_before_serving_end_the_supervisor(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    argv = [sys.executable, "-c", _FAILS_AT_START, str(tmp_path)]
    with caplog.at_level(logging.INFO, logger="zeroserve.supervisor"):
        status = WorkerSupervisor(argv, dict(os.environ), 2, tmp_path).run()
    assert status == 3
    assert len((tmp_path / "starts").read_text().split()) == 2  # none started again
    assert "exited with status 3" in caplog.text
    assert "before any worker served" in caplog.text


class _Load:
    """Sequential echo requests, each on a new connection (so each lands on either
    worker), recording when each started and whether it was answered."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.results: list[tuple[float, bool]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            started = time.monotonic()
            try:
                r = httpx.post(self.url + "/v1/raw/echo", content=b"ping", timeout=scaled(10))
                ok = r.status_code == 200 and r.content == b"ping"
            except httpx.HTTPError:
                ok = False
            self.results.append((started, ok))

    def answered_since(self, t: float) -> int:
        return sum(1 for started, ok in list(self.results) if started >= t and ok)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(scaled(30))


def _answering(url: str, seen: set[int]) -> set[int]:
    """The worker pids seen so far answering ``/v1/stats`` on new connections."""
    seen.add(int(httpx.get(url + "/v1/stats", timeout=scaled(10)).json()["process"]))
    return seen


def test_sigkill_of_a_worker_is_replaced_while_requests_are_answered() -> None:
    server = start_server("--model", "echo", "--workers", "2")
    sup = server.proc.pid
    try:
        workers = _children(sup)
        assert len(workers) == 2
        seen: set[int] = set()
        wait_until(lambda: _answering(server.url, seen) >= workers, 60, "both workers serve")
        load = _Load(server.url)
        try:
            wait_until(lambda: load.answered_since(0) >= 5, 30, "requests answered")
            victim = min(workers)
            os.kill(victim, signal.SIGKILL)
            new = wait_until(
                lambda: _children(sup) - workers, 60, "a worker started in place of the killed"
            )
            assert len(new) == 1 and victim not in _children(sup)
            (fresh,) = new
            seen = set()
            wait_until(lambda: fresh in _answering(server.url, seen), 60, "the new worker serves")
            up = time.monotonic()
            wait_until(lambda: load.answered_since(up) >= 20, 30, "requests after the restart")
        finally:
            load.stop()
        failed_before = [t for t, ok in load.results if not ok and t < up]
        failed_after = [t for t, ok in load.results if not ok and t >= up]
        # Only what was in flight on the killed worker may fail (one sequential client).
        assert failed_after == [], f"{len(failed_after)} failed once the replacement served"
        assert len(failed_before) <= 2, f"{len(failed_before)} failed around the kill"
        alive = _children(sup)
        server.proc.send_signal(signal.SIGTERM)
        status = server.proc.wait(scaled(30))
        left = [p for p in alive if Path(f"/proc/{p}").exists()]  # before stop() kills any
    finally:
        server.stop()
    assert status == 0
    assert left == [], f"workers left after the supervisor exited: {left}"
