"""The machine facts a report gives: each CPU's stolen time, from /proc/stat's format."""

from __future__ import annotations

import time

import pytest

from benchmarks.machine import CpuTimes, steal_line

# /proc/stat's CPU lines: user nice system idle iowait irq softirq steal guest guest_nice.
BEFORE = """cpu  300 0 100 1000 0 0 0 60 0 0
cpu0 100 0 50 800 0 0 0 50 0 0
cpu1 200 0 50 200 0 0 0 10 0 0
intr 12345
"""
AFTER = """cpu  500 0 200 1200 0 0 0 100 0 0
cpu0 150 0 100 900 0 0 0 50 0 0
cpu1 350 0 100 300 0 0 0 50 40 0
intr 23456
"""


def test_steal_is_the_stolen_share_of_each_cpus_elapsed_time() -> None:
    before, after = CpuTimes.parse(BEFORE), CpuTimes.parse(AFTER)
    assert before.total == {0: 1000, 1: 460}  # the aggregate "cpu" line is left out
    shares = after.steal_since(before)
    assert shares[0] == 0.0  # 200 ticks went by, none stolen
    # 340 ticks went by (guest time is inside user, so it is not counted twice); 40 stolen.
    assert shares[1] == pytest.approx(40 / 340)


def test_the_report_line_names_the_cpus_asked_for_from_the_real_proc_stat() -> None:
    before = CpuTimes.read()
    assert before is not None  # Linux: the harness's machine
    # A CPU's share is known once a clock tick has passed (10 ms at USER_HZ 100).
    deadline = time.monotonic() + 5
    line = steal_line(before, [0])
    while line is None and time.monotonic() < deadline:
        time.sleep(0.01)
        line = steal_line(before, [0])
    assert line is not None and line.startswith(
        "CPU time stolen by the hypervisor during this part: CPU 0 "
    )
    assert "CPU 1" not in line
    assert steal_line(None) is None
