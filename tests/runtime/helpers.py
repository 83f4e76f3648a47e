"""Helpers of the runtime suite: engines of test models, cross-process flags and counters,
and the priority probes of /proc."""

from __future__ import annotations

import multiprocessing
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tests.support import await_until
from zeroserve.runtime import Engine, ModelConfig, RuntimeOptions
from zeroserve.runtime.arena import Arena
from zeroserve.runtime.clock import Clock

CTX = multiprocessing.get_context("spawn")
# Upper bound of any wait for a condition; reaching it is a failure, not a timing result.
WAIT_S = 20.0


async def until(cond: Callable[[], bool], what: str = "condition", timeout: float = WAIT_S) -> None:
    """``tests.support.await_until`` for a plain condition, polled every millisecond (the
    runtime's tests wait on the loop they drive)."""

    async def holds() -> bool:
        return cond()

    await await_until(holds, timeout, what, interval=0.001)


def engine(
    executor: str,
    models: dict[str, dict[str, Any]],
    *,
    clock: Clock = time.monotonic,
    arena: Arena | None = None,
    **options: Any,
) -> Engine:
    configs = {
        name: ModelConfig(name=name, executor=executor, **cfg)  # type: ignore[arg-type]
        for name, cfg in models.items()
    }
    return Engine(
        configs,
        arena=arena if arena is not None else Arena(64 << 20),
        clock=clock,
        options=RuntimeOptions(**options),
    )


def flag() -> Any:
    return CTX.Event()


def counter() -> Any:
    return CTX.Value("i", 0)


def nice_of(stat: Path) -> int:
    """The nice value in a /proc ``stat`` file (field 19, after the parenthesised name)."""
    return int(stat.read_text().rsplit(")", 1)[1].split()[16])


def thread_nices(pid: int) -> dict[str, list[int]]:
    """Nice values of a process's threads, by OS thread name ("main" for the first)."""
    out: dict[str, list[int]] = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        name = "main" if int(task.name) == pid else (task / "comm").read_text().strip()
        out.setdefault(name, []).append(nice_of(task / "stat"))
    return out


def policy_of(stat: Path) -> tuple[int, int]:
    """(scheduling policy, real-time priority) in a /proc ``stat`` file (fields 41 and 40:
    0 is SCHED_OTHER, 2 SCHED_RR)."""
    fields = stat.read_text().rsplit(")", 1)[1].split()
    return int(fields[38]), int(fields[37])
