"""What every suite is given: quick or full, where results go, the CPU pinning, how to
reproduce the run, the machine facts, and the command-line overrides."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from .machine import CpuTimes, Pinning
from .servers import ECHO

# Full runs: rounds and seconds of load (and of warm-up) per measurement.
ROUNDS, DURATION_S, WARMUP_S = 3, 5, 1
# --quick: one short round, for smoke tests (noisy numbers).
QUICK_ROUNDS, QUICK_DURATION_S, QUICK_WARMUP_S = 1, 2, 0


@dataclass(frozen=True)
class Settings:
    """One suite's measurement settings (see :meth:`SuiteContext.settings`)."""

    rounds: int
    duration_s: int
    warmup_s: int
    results_dir: Path
    pins: Pinning
    count_writes: bool = False

    @property
    def work(self) -> Path:
        d = self.results_dir / "work"
        d.mkdir(parents=True, exist_ok=True)
        return d


@dataclass(frozen=True)
class SuiteContext:
    quick: bool
    results_dir: Path
    pins: Pinning
    command: str  # how to reproduce this run
    machine: tuple[str, ...] = ()  # date, machine, software lines
    rounds: int | None = None  # overrides (None: the suite's default)
    duration_s: int | None = None
    warmup_s: int | None = None
    count_writes: bool = True  # strace write counting (W2)
    servers: tuple[str, ...] | None = None  # W1/W2: only these servers; cycles: these kinds
    zeroserve_args: tuple[str, ...] = ("--model", ECHO)
    cpu_at_start: CpuTimes | None = None  # the CPUs' times when this part started

    def settings(
        self,
        full: tuple[int, int, int] = (ROUNDS, DURATION_S, WARMUP_S),
        quick: tuple[int, int, int] = (QUICK_ROUNDS, QUICK_DURATION_S, QUICK_WARMUP_S),
        count_writes: bool = False,
    ) -> Settings:
        """(rounds, seconds, warm-up seconds) for this run, overrides applied."""
        rounds, duration, warmup = quick if self.quick else full
        return Settings(
            rounds=self.rounds or rounds,
            duration_s=self.duration_s or duration,
            warmup_s=self.warmup_s if self.warmup_s is not None else warmup,
            results_dir=self.results_dir,
            pins=self.pins,
            count_writes=count_writes and self.count_writes,
        )
