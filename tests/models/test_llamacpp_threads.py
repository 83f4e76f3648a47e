"""A llama.cpp model's decode threads default to the CPUs the server may run on (its
affinity), never more: the engine's threads spin while they wait for each other, so a
thread beyond those CPUs stalls every step (docs/models.md, the ``threads`` option)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.support import scaled

PROBE = (
    "from zeroserve.models.llamacpp import SmolLM2Model;"
    "print(SmolLM2Model().threads, SmolLM2Model(threads=3).threads)"
)


def _threads(cpus: set[int] | None) -> tuple[int, int]:
    def narrow() -> None:
        if cpus is not None:
            os.sched_setaffinity(0, cpus)

    done = subprocess.run(
        [sys.executable, "-c", PROBE],
        preexec_fn=narrow,
        capture_output=True,
        text=True,
        timeout=scaled(60),
        check=True,
    )
    default, given = done.stdout.split()
    return int(default), int(given)


def test_a_server_narrowed_to_one_cpu_decodes_on_one_thread() -> None:
    one = min(os.sched_getaffinity(0))
    assert _threads({one}) == (1, 3)  # an explicit ``threads`` is taken as given


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs 2 CPUs to narrow")
def test_the_default_is_every_cpu_the_server_may_use() -> None:
    assert _threads(None) == (len(os.sched_getaffinity(0)), 3)
