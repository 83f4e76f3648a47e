"""The ``--workers N`` supervisor: N HTTP processes on one port, each replaced when it dies.

Strategy and invariants (docs/deploy.md, "Several workers";
docs/decisions/0059-supervisor-replaces-dead-workers.md):

* The supervisor is the main thread of the process ``zeroserve serve`` started. It starts
  N children (the same command line, marked as children) and waits in ``select`` on a
  pipe that every signal it handles writes to (``signal.set_wakeup_fd``): SIGCHLD when a
  child exits, SIGTERM or SIGINT to stop. Its handlers only note the signal; every
  decision is taken in the loop, so a signal never lands in the middle of one.
* A child *serves* once its metrics socket ``<dir>/<pid>.sock`` exists: the child makes
  it after its listener is up (``server/run.py``).
* A child that exits while the supervisor is not stopping is logged (pid, exit status or
  signal, how long it ran) and replaced: at once when it ran ``STABLE_S`` or longer,
  else after a back-off that doubles with each quick death of its slot in a row, from
  ``RESTART_BACKOFF_S`` up to ``RESTART_BACKOFF_MAX_S``.
* Until one child has served, a dead child's replacement waits: when every child has
  died before any served, the server failed to start (a model that does not load, a
  port in use) and the supervisor exits with their worst status, as one process would,
  rather than starting them again forever.
* SIGTERM and SIGINT are forwarded to every live child and nothing is started after; the
  supervisor returns once every child has exited: 0 when each stopped cleanly (exit 0,
  or ended by the very signal forwarded to it), else the worst status (128 + N for a
  death by signal N, as shells report it).
"""

from __future__ import annotations

import contextlib
import logging
import os
import select
import signal
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import FrameType

log = logging.getLogger("zeroserve.supervisor")

# A worker that ran at least this long before dying is replaced at once, seconds: it
# served (a model that loads in less, and a first request, fit), so its death is not one
# that a new start would repeat in a loop. Under it, its slot backs off.
STABLE_S = 10.0
# The first back-off of a slot whose worker died within STABLE_S of starting, seconds;
# it doubles with each such death in a row (1, 2, 4, 8, 16, 30, 30, ...).
RESTART_BACKOFF_S = 1.0
# The longest back-off, seconds: a worker that cannot start is tried twice a minute,
# which costs nothing while a cause outside it (memory, a file) is being fixed.
RESTART_BACKOFF_MAX_S = 30.0
# The longest wait of the loop when no signal comes, seconds: how soon a child's socket
# is seen (it serves) and an exit is noticed should a SIGCHLD be lost.
POLL_S = 1.0
_STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


def restart_delay(quick_deaths: int) -> float:
    """Seconds before a slot starts its next worker, after ``quick_deaths`` deaths in a
    row within ``STABLE_S`` of their start (0: the last worker ran long enough)."""
    if quick_deaths <= 0:
        return 0.0
    return min(RESTART_BACKOFF_S * 2.0 ** min(quick_deaths - 1, 16), RESTART_BACKOFF_MAX_S)


def exit_status(returncode: int) -> int:
    """A child's ``returncode`` as a process exit status (a signal N: 128 + N)."""
    return returncode if returncode >= 0 else 128 - returncode


def describe_exit(returncode: int) -> str:
    if returncode >= 0:
        return f"exited with status {returncode}"
    try:
        name = signal.Signals(-returncode).name
    except ValueError:
        name = f"signal {-returncode}"
    return f"was killed by {name}"


@dataclass(slots=True)
class _WorkerSlot:
    """One of the N places a worker runs in: its process now, and its history."""

    proc: subprocess.Popen[bytes] | None = None
    started: float = 0.0
    served: bool = False
    quick_deaths: int = 0
    due: float = 0.0  # when its next worker may start (while proc is None)
    last_pid: int = 0


@dataclass(frozen=True, slots=True)
class WorkerSupervisorStatistics:
    """A snapshot: workers alive, and workers started in place of one that died."""

    alive: int
    replaced: int


class WorkerSupervisor:
    """Runs ``workers`` copies of ``argv`` with ``env``; ``ready_dir`` is where a serving
    child makes its ``<pid>.sock``. ``run()`` returns the exit status."""

    def __init__(
        self,
        argv: list[str],
        env: dict[str, str],
        workers: int,
        ready_dir: Path,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._argv = argv
        self._env = env
        self._dir = ready_dir
        self._clock = clock
        self._slots = [_WorkerSlot() for _ in range(workers)]
        self._signals: list[int] = []  # noted by the handler, acted on by the loop
        self._forwarded: set[int] = set()
        self._any_served = False
        self._boot_status = 0  # the worst status of workers that died before any served
        self._stop_status = 0
        self.replaced = 0

    def statistics(self) -> WorkerSupervisorStatistics:
        alive = sum(1 for slot in self._slots if slot.proc is not None)
        return WorkerSupervisorStatistics(alive=alive, replaced=self.replaced)

    def run(self) -> int:
        rfd, wfd = os.pipe()
        os.set_blocking(rfd, False)
        os.set_blocking(wfd, False)
        old_fd = signal.set_wakeup_fd(wfd)
        old = {sig: signal.signal(sig, self._note) for sig in (*_STOP_SIGNALS, signal.SIGCHLD)}
        try:
            for slot in self._slots:
                self._start(slot)
            while (timeout := self._step()) is not None:
                with contextlib.suppress(InterruptedError):
                    select.select([rfd], [], [], timeout)
                with contextlib.suppress(BlockingIOError):
                    while os.read(rfd, 512):
                        pass
        finally:
            for sig, handler in old.items():
                signal.signal(sig, handler)
            signal.set_wakeup_fd(old_fd)
            os.close(rfd)
            os.close(wfd)
        return self._stop_status if self._forwarded else max(self._boot_status, 1)

    def _note(self, signum: int, frame: FrameType | None) -> None:
        if signum != signal.SIGCHLD:
            self._signals.append(signum)

    def _step(self) -> float | None:
        """One pass: forward stop signals, reap and replace workers. The seconds to wait
        before the next pass, or None when the supervisor is done."""
        now = self._clock()
        while self._signals:
            sig = self._signals.pop(0)
            self._forwarded.add(sig)
            for slot in self._slots:
                if slot.proc is not None and slot.proc.poll() is None:
                    slot.proc.send_signal(sig)
        for slot in self._slots:
            proc = slot.proc
            if proc is None:
                continue
            if not slot.served and (self._dir / f"{proc.pid}.sock").exists():
                slot.served = self._any_served = True
            rc = proc.poll()
            if rc is not None:
                self._exited(slot, proc, rc, now)
        alive = any(slot.proc is not None for slot in self._slots)
        if self._forwarded:
            return POLL_S if alive else None
        if not self._any_served:
            if not alive:
                log.error("every worker exited before serving: the server did not start")
                return None
            return POLL_S
        timeout = POLL_S
        for slot in self._slots:
            if slot.proc is None:
                if slot.due <= now:
                    self._start(slot)
                else:
                    timeout = min(timeout, slot.due - now)
        return timeout

    def _start(self, slot: _WorkerSlot) -> None:
        slot.proc = subprocess.Popen(self._argv, env=self._env)
        slot.started = self._clock()
        slot.served = False
        if slot.last_pid:
            self.replaced += 1
            log.warning("worker %d started in place of worker %d", slot.proc.pid, slot.last_pid)

    def _exited(
        self, slot: _WorkerSlot, proc: subprocess.Popen[bytes], rc: int, now: float
    ) -> None:
        slot.proc = None
        slot.last_pid = proc.pid
        # A worker killed with SIGKILL leaves its socket: siblings would try it each scrape.
        with contextlib.suppress(FileNotFoundError):
            (self._dir / f"{proc.pid}.sock").unlink()
        if self._forwarded:
            if rc != 0 and -rc not in self._forwarded:
                log.warning("worker %d %s while stopping", proc.pid, describe_exit(rc))
                self._stop_status = max(self._stop_status, exit_status(rc))
            return
        ran = now - slot.started
        slot.quick_deaths = slot.quick_deaths + 1 if ran < STABLE_S else 0
        delay = restart_delay(slot.quick_deaths)
        slot.due = now + delay
        if not self._any_served:
            self._boot_status = max(self._boot_status, exit_status(rc))
            log.error(
                "worker %d %s after %.1f s, before any worker served; it is started again "
                "once one serves",
                proc.pid,
                describe_exit(rc),
                ran,
            )
            return
        log.error(
            "worker %d %s after %.1f s; starting another in %.1f s",
            proc.pid,
            describe_exit(rc),
            ran,
            delay,
        )
