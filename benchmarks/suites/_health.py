"""``/health`` probed from a process of its own while a stream suite loads the server.

A probe thread inside the load client's process measures that process too: its
asyncio loop (32 streams parsing SSE) holds the GIL against the probe thread, so a
/health answer that left the server in 0.2 ms can be read milliseconds later. The
probe runs in a separate process (spawned: no copy of the client's loop or threads),
which the OS schedules on its own, as a real monitoring client would be.

The floor (``measure_floor``): the same probe against zeroserve serving only ``echo``,
idle; with the machine otherwise idle, with one busy loop on the server's CPU, and with
one on each CPU, the loops at the server's priority. In a model suite the server shares
its CPU with the model's thread or worker and the probe shares the load CPU with the
streaming client, so the last is what the kernel's time slice costs a server whose model
runs at its own priority, however little the server does.
"""

from __future__ import annotations

import multiprocessing
from concurrent.futures import Future, ProcessPoolExecutor
from contextlib import nullcontext

from ..context import Settings, SuiteContext
from ..procs import ServerFailed, busy_loop
from ..report import num
from ..servers import started, zeroserve
from ..stats import percentile
from .w8 import _probe_health

# Seconds past the window within which the probe process must report.
PROBE_SLACK_S = 10.0
# The floor's cases: no busy loop, one on the server's CPU, one on each CPU.
FLOOR_IDLE, FLOOR_SERVER_BUSY, FLOOR_BOTH_BUSY = "idle", "server CPU busy", "both CPUs busy"
FLOOR_CASES = (FLOOR_IDLE, FLOOR_SERVER_BUSY, FLOOR_BOTH_BUSY)
# The key under which a failed floor measurement is kept in a suite's errors.
FLOOR_ERROR = "floor"


def _latencies(port: int, seconds: float) -> list[float]:
    return _probe_health(port, seconds)[0]


class HealthProbe:
    """One spawned probe process, reused for every measurement of a suite."""

    def __init__(self) -> None:
        self._pool = ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn"))
        self._pool.submit(int).result()  # started (and imported) before any measurement

    def start(self, port: int, seconds: float) -> Future[list[float]]:
        """Probe ``port`` every 5 ms for ``seconds``; the future's result is the
        latencies in ms (the whole answer, measured in the probe process)."""
        return self._pool.submit(_latencies, port, seconds)

    def close(self) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)

    def __enter__(self) -> HealthProbe:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def measure_floor(
    ctx: SuiteContext,
    settings: Settings,
    probe: HealthProbe,
    floor: dict[str, list[float]],
    errors: dict[str, str],
) -> None:
    """``/health`` of an idle zeroserve (``echo`` only) in each of ``FLOOR_CASES``: the
    probe's floor, which no server's HTTP layer can go below."""
    seconds = max(settings.duration_s - 0.5, 0.5)
    pins = ctx.pins
    try:
        with started(zeroserve("echo"), pins, ctx.results_dir) as server:
            for case in FLOOR_CASES:
                with (
                    busy_loop(pins.server_cpu, seconds) if case != FLOOR_IDLE else nullcontext(),
                    busy_loop(pins.load_cpu, seconds) if case == FLOOR_BOTH_BUSY else nullcontext(),
                ):
                    got = probe.start(server.port, seconds).result(timeout=seconds + PROBE_SLACK_S)
                floor.setdefault(case, []).extend(got)
                print(f"  floor, {case}: /health p99 {percentile(got, 99):.2f} ms", flush=True)
    except ServerFailed as exc:
        errors[FLOOR_ERROR] = f"start failed: {exc}"


def floor_lines(floor: dict[str, list[float]], errors: dict[str, str]) -> list[str]:
    """The report's paragraph on the floor (nothing if it was not attempted)."""
    if floor:
        return [
            "",
            "The `/health` floor, same probe, same run, zeroserve serving only `echo` (idle): "
            f"p99 {num(percentile(floor.get(FLOOR_IDLE, []), 99))} ms with the machine idle, "
            f"{num(percentile(floor.get(FLOOR_SERVER_BUSY, []), 99))} ms with one busy loop "
            "on the server's CPU, "
            f"{num(percentile(floor.get(FLOOR_BOTH_BUSY, []), 99))} ms with one on each CPU. "
            "The busy loops run at the server's own priority. Above, every server shares "
            "its CPU with the model's thread or worker and the probe shares the load CPU with "
            "the streaming client, so at equal priority the kernel's time slice is that much "
            "of a server's /health p99 however little it does; zeroserve runs model work "
            "below its event loop (`--model-nice`, default 10), the other servers do not.",
        ]
    if FLOOR_ERROR in errors:
        return ["", f"The `/health` floor: not measured: {errors[FLOOR_ERROR][:140]}"]
    return []
