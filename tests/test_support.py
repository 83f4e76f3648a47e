"""tests/support's waiting helpers: the one slowdown factor and the poll with a deadline."""

from __future__ import annotations

import asyncio
import itertools
import os
import signal
import subprocess
import sys

import pytest

from tests.support import SLOWDOWN_VARIABLE, await_until, scaled, slowdown, wait_until
from tests.support.process import ROOT, kill_group, server_env
from tests.support.timing import (
    LOAD_SLOWDOWN_CAP,
    MODEL_SLOWDOWN_CAP,
    machine_slowdown,
    model_scaled,
    model_slowdown,
    slowdown_at_nice,
    slowdown_for_load,
)


def test_scaled_multiplies_by_the_suite_factor(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(SLOWDOWN_VARIABLE, raising=False)
    assert slowdown() == 1.0
    assert scaled(2.0) == 2.0
    monkeypatch.setenv(SLOWDOWN_VARIABLE, "3")
    assert scaled(2.0) == 6.0


@pytest.mark.parametrize("raw", ["fast", "0.5", "nan"])
def test_a_bad_factor_is_refused_naming_the_variable(
    monkeypatch: pytest.MonkeyPatch, raw: str
) -> None:
    monkeypatch.setenv(SLOWDOWN_VARIABLE, raw)
    with pytest.raises(ValueError, match=SLOWDOWN_VARIABLE):
        slowdown()


def test_wait_until_returns_the_first_truthy_value() -> None:
    counter = itertools.count()
    assert wait_until(lambda: next(counter) >= 3 and "ready", 5.0, "the counter") == "ready"


def test_wait_until_names_what_it_waited_for(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(SLOWDOWN_VARIABLE, "1")
    with pytest.raises(AssertionError, match="waiting for the impossible"):
        wait_until(lambda: False, 0.0, "the impossible")


def test_await_until_polls_a_coroutine() -> None:
    counter = itertools.count()

    async def reached() -> bool:
        return next(counter) >= 2

    assert asyncio.run(await_until(reached, 5.0, "the counter")) is True


@pytest.mark.parametrize(
    ("load", "cpus", "factor"),
    [
        (0.0, 2, 1.0),  # a quiet machine: the bounds as written
        (0.05, 2, 1.1),  # rounded up to a tenth
        (2.0, 2, 2.0),  # one busy process per core: half the time each
        (5.0, 2, 3.5),
        (100.0, 2, 8.0),  # capped: past it the runner says the factor itself
    ],
)
def test_the_factor_from_the_load_is_the_share_of_the_cores_lost(
    load: float, cpus: int, factor: float
) -> None:
    assert slowdown_for_load(load, cpus) == factor


@pytest.mark.parametrize(("load", "cpus"), [(-1.0, 2), (float("nan"), 2), (1.0, 0)])
def test_a_load_that_cannot_be_read_is_refused(load: float, cpus: int) -> None:
    with pytest.raises(ValueError, match="no slowdown"):
        slowdown_for_load(load, cpus)


def test_the_machine_factor_is_a_valid_factor(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(SLOWDOWN_VARIABLE, f"{machine_slowdown():g}")
    assert 1.0 <= slowdown() <= LOAD_SLOWDOWN_CAP


@pytest.mark.parametrize(
    ("factor", "nice", "niced"),
    [
        (1.0, 10, 1.0),  # a quiet machine: nothing to share with, nice or not
        (3.0, 0, 3.0),  # not niced: the suite's own factor
        (1.1, 10, 2.0),  # a tenth of a busy core costs a nice-10 thread about 9 tenths
        (2.0, 10, 10.4),  # one busy nice-0 process per core: 110 / (110 + 1024) of a core
        (4.0, 10, 29.0),
        (8.0, 10, MODEL_SLOWDOWN_CAP),  # capped: a hang still fails within minutes
    ],
)
def test_niced_work_feels_the_scheduler_weights_share(
    factor: float, nice: int, niced: float
) -> None:
    assert slowdown_at_nice(factor, nice) == niced


def test_a_nice_above_the_loop_is_refused() -> None:
    with pytest.raises(ValueError, match="no slowdown for nice"):
        slowdown_at_nice(2.0, -1)


def test_model_waits_scale_by_the_niced_factor(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(SLOWDOWN_VARIABLE, "2")
    assert model_slowdown() == 10.4
    assert model_scaled(10.0) == 104.0
    monkeypatch.setenv(SLOWDOWN_VARIABLE, "1")
    assert model_scaled(10.0) == 10.0


def test_a_model_wait_until_names_its_niced_bound(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(SLOWDOWN_VARIABLE, "2")
    with pytest.raises(AssertionError, match=r"after 0\.1s waiting for the model"):
        wait_until(lambda: False, 0.01, "the model", model=True)


def test_a_terminated_test_process_leaves_no_server_running() -> None:
    # A runner's time limit ends pytest with SIGTERM, skipping the fixtures that stop the
    # servers: the launcher kills the groups it started as the process exits.
    script = (
        "import signal\n"
        "from tests.support import start_server\n"
        "server = start_server('--model', 'echo')\n"
        "print(server.proc.pid, flush=True)\n"
        "while True:\n"
        "    signal.pause()\n"
    )
    runner = subprocess.Popen(
        [sys.executable, "-c", script],
        cwd=ROOT,
        env=server_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    assert runner.stdout is not None
    with runner.stdout:
        server_pid = int(runner.stdout.readline())
    try:
        runner.send_signal(signal.SIGTERM)
        runner.wait(scaled(30.0))

        def gone() -> bool:
            try:
                os.kill(server_pid, 0)
            except ProcessLookupError:
                return True
            return False

        wait_until(gone, 10.0, "the server to go with the process that started it")
    finally:
        kill_group(server_pid)
        if runner.poll() is None:
            runner.kill()
            runner.wait()
