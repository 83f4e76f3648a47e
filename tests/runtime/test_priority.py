"""Model work runs below the HTTP event loop (docs/decisions/0001-model-nice-levels.md and
docs/decisions/0002-loop-real-time-priority.md): worker processes and model threads are
niced, the loop's thread is not. Read from /proc of the real server process and its
workers."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from tests.runtime.helpers import nice_of, policy_of, thread_nices
from tests.support import ROOT, ServerProcess, scaled, serve_argv, start_server, wait_until

pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux"), reason="per-thread nice values are Linux's"
)

# Seconds to wait for a worker process to appear or a thread to be started.
APPEAR_TIMEOUT_S = 30.0


def children(pid: int) -> list[int]:
    found: list[int] = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        text = (task / "children").read_text().split()
        found += [int(c) for c in text]
    return found


def workers(pid: int) -> list[int]:
    """The server's worker processes: its python children, not the multiprocessing
    resource tracker, which runs no model."""
    return [
        c
        for c in children(pid)
        if b"resource_tracker" not in Path(f"/proc/{c}/cmdline").read_bytes()
    ]


def _worker_nices(server: ServerProcess) -> list[int]:
    return [nice_of(Path(f"/proc/{w}/stat")) for w in workers(server.proc.pid)]


def test_process_workers_run_below_the_loop_and_a_model_may_say_how_far() -> None:
    server = start_server(
        "--model",
        "echo?executor=process&workers=2",
        "--model",
        "near=zeroserve.models.echo:EchoModel?executor=process&nice=3",
    )
    try:
        nices = wait_until(
            lambda: sorted(_worker_nices(server)) if len(_worker_nices(server)) == 3 else None,
            APPEAR_TIMEOUT_S,
            "3 workers",
        )
        assert nices == [3, 10, 10]
        assert thread_nices(server.proc.pid)["main"] == [0]  # the event loop's thread
        r = httpx.post(server.url + "/v1/raw/echo", content=b"still served")
        assert r.status_code == 200 and r.content == b"still served"
    finally:
        assert server.stop() == 0


def test_every_thread_of_a_worker_runs_below_the_loop_those_older_than_the_call_too() -> None:
    """A worker imports numpy (and with it a BLAS pool of threads that runs the model's
    matrix products) before it lowers itself; ``os.nice`` lowered only the calling thread,
    and that pool kept the loop's priority."""
    server = start_server("--model", "echo?executor=process")
    try:
        wait_until(lambda: workers(server.proc.pid), APPEAR_TIMEOUT_S, "a worker")
        (worker,) = workers(server.proc.pid)
        wait_until(
            lambda: thread_nices(worker)["main"] == [10],
            APPEAR_TIMEOUT_S,
            "the worker lowering itself",
        )
        r = httpx.post(server.url + "/v1/raw/echo", content=b"served by the worker")
        assert r.status_code == 200 and r.content == b"served by the worker"
        nices = [n for ns in thread_nices(worker).values() for n in ns]
        if len(nices) == 1:
            pytest.skip(
                "the worker runs no thread besides its main one here (one CPU: no BLAS pool)"
            )
        assert nices == [10] * len(nices), thread_nices(worker)
    finally:
        assert server.stop() == 0


def test_model_nice_zero_keeps_workers_at_the_loops_priority() -> None:
    server = start_server("--model-nice", "0", "--model", "echo?executor=process")
    try:
        assert wait_until(lambda: _worker_nices(server), APPEAR_TIMEOUT_S, "a worker") == [0]
    finally:
        assert server.stop() == 0


def test_thread_executor_threads_run_below_the_loop() -> None:
    server = start_server("--model", "echo?executor=thread")
    try:
        r = httpx.post(server.url + "/v1/raw/echo", content=b"on a pool thread")
        assert r.status_code == 200 and r.content == b"on a pool thread"
        # Python does not name OS threads; the pool's thread is the one niced.
        nices = thread_nices(server.proc.pid)
        assert nices["main"] == [0]
        others = [n for name, ns in nices.items() if name != "main" for n in ns]
        assert 10 in others, nices
    finally:
        assert server.stop() == 0


@pytest.mark.parametrize(
    "args", [("--model-nice", "20"), ("--model", "bad=zeroserve.models.echo:EchoModel?nice=-1")]
)
def test_a_nice_out_of_range_is_refused_at_start(args: tuple[str, str]) -> None:
    with pytest.raises(RuntimeError, match="nice"):
        start_server("--model", "echo", *args)


# -- the loop thread real-time (--loop-rt-priority) ---------------------------------------
SCHED_OTHER, SCHED_RR = 0, 2


def _realtime_permitted() -> bool:
    probe = "import os; os.sched_setscheduler(0, os.SCHED_RR, os.sched_param(1))"
    return subprocess.run([sys.executable, "-c", probe], capture_output=True).returncode == 0


def _policies(pid: int) -> dict[int, tuple[int, int]]:
    return {
        int(task.name): policy_of(task / "stat") for task in Path(f"/proc/{pid}/task").iterdir()
    }


@pytest.mark.skipif(not _realtime_permitted(), reason="real-time scheduling is not permitted")
def test_loop_rt_priority_makes_only_the_loop_thread_real_time() -> None:
    server = start_server(
        "--loop-rt-priority",
        "1",
        "--model",
        "echo?executor=process",
        "--model",
        "pooled=zeroserve.models.echo:EchoModel?executor=thread",
    )
    try:
        for model in ("echo", "pooled"):  # the pool's thread is started by a request
            r = httpx.post(f"{server.url}/v1/raw/{model}", content=b"served")
            assert r.status_code == 200 and r.content == b"served"
        pid = server.proc.pid
        threads = _policies(pid)
        assert threads.pop(pid) == (SCHED_RR, 1)  # the event loop's thread
        assert threads and set(threads.values()) == {(SCHED_OTHER, 0)}, threads
        assert 10 in [n for ns in thread_nices(pid).values() for n in ns]  # still niced
        found = workers(pid)
        assert found
        for worker in found:
            assert set(_policies(worker).values()) == {(SCHED_OTHER, 0)}
            assert nice_of(Path(f"/proc/{worker}/stat")) == 10
    finally:
        assert server.stop() == 0


@pytest.mark.skipif(shutil.which("setpriv") is None, reason="needs setpriv (util-linux)")
def test_loop_rt_priority_without_the_privilege_stops_the_start_with_the_reason() -> None:
    # No CAP_SYS_NICE (as root too) and a real-time priority limit of 0.
    cmd = [
        "setpriv",
        "--inh-caps=-sys_nice",
        "--bounding-set=-sys_nice",
        "--",
        "prlimit",
        "--rtprio=0",
        *serve_argv("--loop-rt-priority", "1", "--model", "echo"),
    ]
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    done = subprocess.run(
        cmd, capture_output=True, text=True, env=env, timeout=scaled(60), cwd=ROOT
    )
    assert done.returncode == 2, done.stdout + done.stderr
    assert "loop_rt_priority 1 is not permitted" in done.stderr
    assert "ulimit -r" in done.stderr


def test_a_loop_rt_priority_out_of_range_is_refused_at_start() -> None:
    with pytest.raises(RuntimeError, match="loop_rt_priority"):
        start_server("--model", "echo", "--loop-rt-priority", "100")
