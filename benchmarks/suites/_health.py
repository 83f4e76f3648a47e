"""``/health`` probed from a process of its own while a stream suite loads the server.

A probe thread inside the load client's process measures that process too: its
asyncio loop (32 streams parsing SSE) holds the GIL against the probe thread, so a
/health answer that left the server in 0.2 ms can be read milliseconds later. The
probe runs in a separate process (spawned: no copy of the client's loop or threads),
which the OS schedules on its own, as a real monitoring client would be.

That process shares the load CPU with the load client, which keeps it busy; at equal
priority each of the probe's wake-ups waits for the client's time slice, and the probe
reports that CPU's contention as the server's latency. So the probe raises itself to
real-time priority where that is permitted (``machine.probe_priority``); it is the same
probe for every server, and one sample every 5 ms cannot starve the load. Measured on the
floor below (4 interleaved rounds of 4.5 s per case, a quiet 2-CPU VM): with one busy loop
on each CPU, p99 6.7 ms at normal priority (4.2 to 7.7 per round) against 4.2 ms at
real-time, which is what the busy server CPU alone costs (4.3 ms either way).

The floor (``measure_floor``): the same probe against zeroserve serving only ``echo``,
idle; with the machine otherwise idle, with one busy loop on the server's CPU, and with
one on each CPU, the loops at the server's priority. In a model suite the server shares
its CPU with the model's thread or worker, so the second is what the kernel's time slice
costs a server whose model runs at its own priority, however little the server does; the
third adds the load CPU's contention, which a real-time probe should not see.
"""

from __future__ import annotations

import multiprocessing
import socket
import time
from concurrent.futures import Future, ProcessPoolExecutor
from contextlib import nullcontext
from typing import NamedTuple

from ..context import Settings, SuiteContext
from ..machine import probe_priority
from ..probe import NOT_RAISED
from ..procs import LOOPBACK, ServerFailed, busy_loop
from ..report import num, probe_note
from ..servers import started, zeroserve
from ..stats import percentile
from ._runtime import IO_TIMEOUT_S, raw_request, read_response

# Seconds past the window within which the probe process must report.
PROBE_SLACK_S = 10.0
# /health is sent this often: often enough for a p99 over a few seconds of load, rarely
# enough that the probe adds nothing measurable to the server's work.
PROBE_INTERVAL_S = 0.005
# The floor's cases: no busy loop, one on the server's CPU, one on each CPU.
FLOOR_IDLE, FLOOR_SERVER_BUSY, FLOOR_BOTH_BUSY = "idle", "server CPU busy", "both CPUs busy"
FLOOR_CASES = (FLOOR_IDLE, FLOOR_SERVER_BUSY, FLOOR_BOTH_BUSY)
# The key under which a failed floor measurement is kept in a suite's errors.
FLOOR_ERROR = "floor"


class HealthSamples(NamedTuple):
    """One probing window: the answered probes' latencies and the failed ones."""

    latencies_ms: list[float]  # send to the whole 200 answer, in ms
    failures: int  # non-200 answers, refused or broken connections


def probe_health(port: int, seconds: float) -> HealthSamples:
    """GET /health every :data:`PROBE_INTERVAL_S` on one keep-alive connection for
    ``seconds`` (run in the probe process)."""
    req = raw_request("GET", "/health")
    lat: list[float] = []
    failures = 0
    sock: socket.socket | None = None
    buf = bytearray()
    deadline = time.monotonic() + seconds
    for _ in range(int(seconds / PROBE_INTERVAL_S) + 1):
        if time.monotonic() >= deadline:
            break
        try:
            if sock is None:
                sock = socket.create_connection((LOOPBACK, port), timeout=IO_TIMEOUT_S)
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                buf.clear()
            t0 = time.perf_counter()
            sock.sendall(req)
            status, _ = read_response(sock, buf)
            dt_ms = (time.perf_counter() - t0) * 1000
            if status == 200:
                lat.append(dt_ms)
            else:
                failures += 1
        except OSError:
            failures += 1
            if sock is not None:
                sock.close()
            sock = None
        time.sleep(PROBE_INTERVAL_S)
    if sock is not None:
        sock.close()
    return HealthSamples(lat, failures)


# The probe process's priority, in words; set once by ``_raise`` when the process starts.
_priority = NOT_RAISED


def _raise(realtime: bool) -> None:
    global _priority
    if realtime:
        _priority = probe_priority()


def _priority_words() -> str:
    return _priority


class HealthProbe:
    """One spawned probe process, reused for every measurement of a suite.

    Args:
        realtime: raise the process to real-time priority when permitted (the default;
            False only to measure what that changes).
    """

    def __init__(self, realtime: bool = True) -> None:
        self._pool = ProcessPoolExecutor(
            1,
            mp_context=multiprocessing.get_context("spawn"),
            initializer=_raise,
            initargs=(realtime,),
        )
        # Started (and imported) before any measurement; the words for the report.
        self.priority: str = self._pool.submit(_priority_words).result()

    def start(self, port: int, seconds: float) -> Future[HealthSamples]:
        """Probe ``port`` every 5 ms for ``seconds``; the future's result is the window's
        samples (the whole answer, measured in the probe process)."""
        return self._pool.submit(probe_health, port, seconds)

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
                    window = probe.start(server.port, seconds)
                    got = window.result(timeout=seconds + PROBE_SLACK_S).latencies_ms
                floor.setdefault(case, []).extend(got)
                print(f"  floor, {case}: /health p99 {percentile(got, 99):.2f} ms", flush=True)
    except ServerFailed as exc:
        errors[FLOOR_ERROR] = f"start failed: {exc}"


def floor_lines(floor: dict[str, list[float]], errors: dict[str, str], priority: str) -> list[str]:
    """The report's paragraph on the floor (nothing if it was not attempted); ``priority``
    is the probe's (``HealthProbe.priority``)."""
    if floor:
        return [
            "",
            "The `/health` floor, same probe, same run, zeroserve serving only `echo` (idle): "
            f"p99 {num(percentile(floor.get(FLOOR_IDLE, []), 99))} ms with the machine idle, "
            f"{num(percentile(floor.get(FLOOR_SERVER_BUSY, []), 99))} ms with one busy loop "
            "on the server's CPU, "
            f"{num(percentile(floor.get(FLOOR_BOTH_BUSY, []), 99))} ms with one on each CPU. "
            "The busy loops run at the server's own priority. Above, every server shares "
            "its CPU with the model's thread or worker, so at equal priority the kernel's "
            "time slice is that much of a server's /health p99 however little it does; "
            "zeroserve runs model work below its event loop (`--model-nice`, default 10), "
            "the other servers do not. "
            + probe_note("probe", priority)
            + " The last case shows what the busy load CPU still adds.",
        ]
    if FLOOR_ERROR in errors:
        return ["", f"The `/health` floor: not measured: {errors[FLOOR_ERROR][:140]}"]
    return []
