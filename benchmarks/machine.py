"""Machine facts and CPU pinning: where the server, the load and an upstream run.

The server under test is pinned to :data:`SERVER_CPU`, the load generator, probes and the
harness itself to :data:`LOAD_CPU`, and a gateway's upstream to :data:`AUX_CPU` when the
machine has a third CPU (else it shares the server's). With fewer than two CPUs nothing
is pinned and the report says so.

A latency probe process raises itself to real-time priority (:func:`probe_priority`): it
shares the load CPU with the load generator, and at equal priority its wake-ups would
wait for the load's time slice, so it would report that CPU's contention as the server's
latency.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import os
import platform
import shutil
import subprocess
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

SERVER_CPU = 0
LOAD_CPU = 1
AUX_CPU = 2
# A probe's real-time level: SCHED_FIFO's lowest. Any level preempts the load generator
# (a normal-priority process) the moment the probe wakes; the lowest stays below anything
# the machine itself runs at real-time priority. A probe sleeps between samples and spends
# each one blocked on the server, so it cannot starve the load it shares the CPU with.
PROBE_RT_PRIORITY = 1
SOFTWARE = (
    "zeroserve",
    "uvicorn",
    "fastapi",
    "pydantic",
    "uvloop",
    "httptools",
    "granian",
    "aiohttp",
    "msgspec",
)


# The CPUs the harness may place processes on: its affinity when this module is imported,
# before ``harness_on_load_cpu`` narrows it to LOAD_CPU. Placement is judged against these,
# never against the narrowed affinity: checked against that, SERVER_CPU looked unavailable
# and every server was started unpinned, inheriting the load generator's CPU.
_USABLE = frozenset(os.sched_getaffinity(0))


def cpu_count() -> int:
    return len(_USABLE)


def pin_prefix(cpu: int | None) -> list[str]:
    """``taskset -c N`` when pinning is possible, else nothing (one-core machines)."""
    if cpu is None or cpu not in _USABLE or shutil.which("taskset") is None:
        return []
    return ["taskset", "-c", str(cpu)]


def probe_priority() -> str:
    """Run the calling process at real-time priority (SCHED_FIFO, :data:`PROBE_RT_PRIORITY`)
    if the machine permits it, else leave it as it is.

    Children it forks start at normal priority again (``SCHED_RESET_ON_FORK``): only the
    probe itself is meant to preempt the load.

    Returns:
        The priority the process now runs at, in words for a report: ``"real-time
        (SCHED_FIFO 1)"``, or ``"normal priority (real-time refused: ...)"``.
    """
    policy = os.SCHED_FIFO | os.SCHED_RESET_ON_FORK
    try:
        os.sched_setscheduler(0, policy, os.sched_param(PROBE_RT_PRIORITY))
    except OSError as exc:  # EPERM without CAP_SYS_NICE or an RLIMIT_RTPRIO to cover it
        return f"normal priority (real-time refused: {exc.strerror or exc})"
    return f"real-time (SCHED_FIFO {PROBE_RT_PRIORITY})"


def is_realtime(priority: str) -> bool:
    """Whether :func:`probe_priority`'s words say the probe runs at real-time priority."""
    return priority.startswith("real-time")


@dataclass(frozen=True)
class Pinning:
    """The CPUs of one run; all None when the machine cannot keep them apart."""

    server_cpu: int | None
    load_cpu: int | None

    @property
    def pinned(self) -> bool:
        return self.server_cpu is not None

    @property
    def aux_cpu(self) -> int | None:
        """CPU for a gateway's upstream: a third one if there is one, else the server's."""
        if self.server_cpu is None:
            return None
        return AUX_CPU if cpu_count() >= 3 and AUX_CPU in _USABLE else (self.server_cpu)

    @classmethod
    def detect(cls) -> Pinning:
        if cpu_count() >= 2 and {SERVER_CPU, LOAD_CPU} <= _USABLE:
            return cls(SERVER_CPU, LOAD_CPU)
        return cls(None, None)


@contextlib.contextmanager
def harness_on_load_cpu(pins: Pinning) -> Iterator[None]:
    """Keep the harness (clients, probes, samplers) off the server's core; restore the
    affinity on exit, because the harness may run inside another process (the tests)."""
    original = os.sched_getaffinity(0)
    if pins.load_cpu is not None:
        os.sched_setaffinity(0, {pins.load_cpu})
    try:
        yield
    finally:
        os.sched_setaffinity(0, original)


def _cpu_model() -> str:
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or "unknown CPU"


def _wrk_version() -> str:
    if shutil.which("wrk") is None:
        return ""
    out = subprocess.run(["wrk", "--version"], capture_output=True, text=True, check=False)
    text = out.stdout or out.stderr
    return text.splitlines()[0].split(" Copyright")[0] if text else ""


@dataclass(frozen=True)
class CpuTimes:
    """Each CPU's time from ``/proc/stat`` (in clock ticks): all of it, and the share the
    hypervisor gave to other guests ("steal"). A virtual machine's CPU that is stolen
    simply stops; a few percent of steal puts millisecond gaps into every latency
    percentile of a run (measured here: an idle server's ``/health`` p99 was 7-8 ms at 9-11 %
    steal, 0.56 ms at 0.1-0.2 %), so each part of a report says how much it had."""

    total: dict[int, int]
    steal: dict[int, int]

    @classmethod
    def parse(cls, text: str) -> CpuTimes:
        total: dict[int, int] = {}
        steal: dict[int, int] = {}
        for line in text.splitlines():
            name, *fields = line.split()
            if not name.startswith("cpu") or name == "cpu" or len(fields) < 8:
                continue
            ticks = [int(f) for f in fields[:8]]  # user .. steal; guest time is inside user
            cpu = int(name[3:])
            total[cpu], steal[cpu] = sum(ticks), ticks[7]
        return cls(total, steal)

    @classmethod
    def read(cls) -> CpuTimes | None:
        try:
            return cls.parse(Path("/proc/stat").read_text())
        except (OSError, ValueError):
            return None

    def steal_since(self, before: CpuTimes) -> dict[int, float]:
        """Per CPU, the share of the time since ``before`` that was stolen (0..1)."""
        shares: dict[int, float] = {}
        for cpu, total in self.total.items():
            elapsed = total - before.total.get(cpu, total)
            if elapsed > 0:
                shares[cpu] = (self.steal[cpu] - before.steal[cpu]) / elapsed
        return shares


def steal_line(before: CpuTimes | None, cpus: Iterable[int] | None = None) -> str | None:
    """A report's line: the share of ``cpus``' time (default: every CPU's) the hypervisor
    took since ``before``; None when ``/proc/stat`` could not be read."""
    now = CpuTimes.read()
    if before is None or now is None:
        return None
    shares = now.steal_since(before)
    wanted = sorted(shares) if cpus is None else cpus
    told = [f"CPU {c} {100 * shares[c]:.1f} %" for c in wanted if c in shares]
    if not told:
        return None
    return (
        "CPU time stolen by the hypervisor during this part: " + ", ".join(told) + " (a "
        "stolen CPU stops: more than about 1 % shows in every latency percentile)"
    )


def load_average() -> str:
    """The 1, 5 and 15 minute load averages, as /proc/loadavg gives them."""
    try:
        return " ".join(Path("/proc/loadavg").read_text().split()[:3])
    except OSError:
        return "?"


def facts() -> list[str]:
    """Date, machine and software lines for a report (one line each)."""
    mem = ""
    with contextlib.suppress(OSError, ValueError, IndexError):
        kib = int(Path("/proc/meminfo").read_text().split()[1])
        mem = f", {kib / 1024 / 1024:.0f} GiB RAM"
    versions = []
    for pkg in SOFTWARE:
        with contextlib.suppress(metadata.PackageNotFoundError):
            versions.append(f"{pkg} {metadata.version(pkg)}")
    wrk_v = _wrk_version()
    return [
        f"Date: {dt.datetime.now(dt.UTC).strftime('%Y-%m-%d %H:%M UTC')}; "
        f"load average {load_average()} at the start of the run (background load skews "
        "absolute numbers)",
        f"Machine: {_cpu_model()}, {cpu_count()} CPUs available{mem}; {platform.system()} "
        f"{platform.release()}; Python {platform.python_version()}",
        "Software: " + ", ".join(versions) + (f"; {wrk_v}" if wrk_v else ""),
    ]
