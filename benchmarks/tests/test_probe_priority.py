"""The latency probes' priority (``machine.probe_priority``): real-time where the machine
permits it, normal priority with the reason where it refuses, and never passed on to a
child. Each case runs in a fresh interpreter, so this test process keeps its own priority;
the policy is read back from the kernel (``sched_getscheduler``), not taken from the words.
"""

from __future__ import annotations

import os
import resource
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from tests.support import scaled

from benchmarks.machine import is_realtime

ROOT = Path(__file__).resolve().parents[2]
# The refused case as root: CAP_SYS_NICE grants real-time whatever RLIMIT_RTPRIO says, so
# the child drops it from its bounding set (root then execs without it).
WITHOUT_SYS_NICE = ["setpriv", "--bounding-set=-sys_nice", "--"]
# The child: raise itself, then report its own policy, a forked child's policy, and the words.
CHILD = """\
import os, subprocess, sys
from benchmarks.machine import probe_priority
words = probe_priority()
print(os.sched_getscheduler(0) & ~os.SCHED_RESET_ON_FORK)
grandchild = [sys.executable, "-c", "import os; print(os.sched_getscheduler(0))"]
print(subprocess.run(grandchild, capture_output=True, text=True, check=True).stdout.strip())
print(words)
"""


def _run_child(refuse: bool) -> tuple[int, int, str]:
    """(the child's policy, its own child's policy, ``probe_priority``'s words)."""

    def no_rt_budget() -> None:
        resource.setrlimit(resource.RLIMIT_RTPRIO, (0, 0))

    drop = WITHOUT_SYS_NICE if refuse and os.geteuid() == 0 else []
    done = subprocess.run(
        [*drop, sys.executable, "-c", CHILD],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=scaled(60),
        check=False,
        preexec_fn=no_rt_budget if refuse else None,
    )
    assert done.returncode == 0, done.stderr
    policy, forked, words = done.stdout.splitlines()
    return int(policy), int(forked), words


def test_the_probe_runs_at_the_priority_it_reports() -> None:
    policy, forked, words = _run_child(refuse=False)
    assert policy in (os.SCHED_FIFO, os.SCHED_OTHER)
    assert (policy == os.SCHED_FIFO) == is_realtime(words), words
    # Whatever the probe starts is not real-time: only the probe may preempt the load.
    assert forked == os.SCHED_OTHER


@pytest.mark.skipif(
    os.geteuid() == 0 and shutil.which("setpriv") is None,
    reason="as root, needs setpriv (util-linux) to run a child without CAP_SYS_NICE",
)
def test_a_refused_probe_stays_at_normal_priority_and_says_why() -> None:
    policy, forked, words = _run_child(refuse=True)
    assert policy == os.SCHED_OTHER
    assert forked == os.SCHED_OTHER
    assert not is_realtime(words)
    assert words.startswith("normal priority (real-time refused: "), words
