"""The CPU priority of model work: below the HTTP event loop's
(docs/decisions/0001-model-nice-levels.md, docs/decisions/0002-loop-real-time-priority.md).

A model that keeps a core busy (an engine's decode thread, a worker process) shares it
with the event loop. At equal priority the kernel lets a woken loop wait until the busy
thread's slice ends: ``/health`` p99 was about 4 ms beside one busy loop on the server's
core, whatever the server did. With the model's threads and processes a few nice levels
below the loop, the woken loop runs at once, as long as the loop itself does little. The
model loses nothing while it is alone with the loop: the loop only ever takes the CPU it
needs, and the model gets the rest (measured, smollm2 x8 on one engine thread: the same
tokens/s at nice 0 and 10, and ``/health`` p99 0.8-1.2 ms instead of 4.0-4.3 ms). Against other busy processes of the
machine the model does get a smaller share; ``model_nice`` 0 turns this off.

Nice is not enough when the model and the loop share one core and the loop is busy
itself (32 ``tinyllm`` streams on the process executor, the server pinned to one CPU):
the loop's own bursts (1-3 ms of token writing while the worker waits for the core) take
it past its fair share, and the kernel's fair scheduler (EEVDF) then makes it wait on a
wake-up until the worker threads have caught up. Measured with ``perf sched`` there:
the woken loop waited p90 3.5 ms, p99 5.6 ms for the core, and ``/health`` p99 was 6-7 ms
at nice 10, 19 and even ``SCHED_IDLE`` workers alike. Meanwhile the worker's pool threads
run one after another, each for a whole 4 ms scheduler tick; a pool of one thread gives
the loop its turn (p99 0.6-0.8 ms) but costs a fifth of the tokens/s
(docs/decisions/0002-loop-real-time-priority.md has the measurements). Only a real-time
class for the loop
removes that wait (p99 0.006 ms; ``/health`` p99 0.4-0.5 ms in the tinyllm benchmark),
at a cost: the loop then runs on every wake-up and writes smaller batches, so it takes
more of the shared core (tokens/s 0.99x, 0.93x and 0.82x of the default at 1, 8 and 32
streams). It also takes a privilege, so it is opt-in: ``loop_rt_priority``
(:func:`raise_loop`).

Linux sets a nice value per thread (``setpriority(PRIO_PROCESS, tid)``) and a new
thread inherits its creator's: lowering a thread before it creates an engine's threads
lowers them all. Elsewhere the call would renice the whole process, the loop included,
so the thread functions do nothing there. Raising a priority back needs privileges, so a
lowered thread stays lowered for its life: only threads made for model work are.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import os
import sys
import threading
from collections.abc import Callable
from typing import TypeVar

from ..errors import ConfigError

T = TypeVar("T")

# Nice levels model work runs below the event loop. The kernel's weight falls about 1.25x
# a level, so 10 levels leave a busy model ~1/10 of the loop's weight when both want the
# CPU: enough for the loop to win every wake-up, and the model still runs whenever the
# loop is idle (which, serving tokens, is nearly always). 19 is the lowest priority.
DEFAULT_MODEL_NICE = 10
MAX_NICE = 19
# SCHED_RR priorities (Linux: 1 is the lowest real-time level, 99 the highest).
MAX_RT_PRIORITY = 99

_PER_THREAD = sys.platform.startswith("linux")


def lower_thread(nice: int) -> None:
    """Lower the calling thread's priority by ``nice`` levels (capped at ``MAX_NICE``);
    threads it creates from now on inherit it. A no-op for 0, and off Linux."""
    if nice <= 0 or not _PER_THREAD:
        return
    _lower(threading.get_native_id(), nice)


def lower_process(nice: int) -> None:
    """Lower this whole process (a worker: all of it is model work) by ``nice`` levels.

    On Linux a nice value is a thread's, and ``os.nice`` sets the caller's only: a thread
    started before this call keeps the loop's priority. A worker has one: the BLAS pool
    numpy starts when the worker's modules are imported, which runs the model's matrix
    products beside its main thread. So every thread of the process is lowered by its id;
    the threads started afterwards inherit the main thread's value."""
    if nice <= 0:
        return
    if not _PER_THREAD:
        try:
            os.nice(min(nice, MAX_NICE - os.getpriority(os.PRIO_PROCESS, 0)))
        except OSError:
            pass
        return
    for tid in os.listdir("/proc/self/task"):
        _lower(int(tid), nice)


def _lower(tid: int, nice: int) -> None:
    try:
        now = os.getpriority(os.PRIO_PROCESS, tid)
        os.setpriority(os.PRIO_PROCESS, tid, min(MAX_NICE, now + nice))
    except OSError:  # a sandbox that forbids it, or the thread ended: it runs as it was
        pass


async def call_lowered(fn: Callable[[], T], nice: int) -> T:
    """``fn()`` on a thread of its own, lowered by ``nice``, so the threads ``fn`` starts
    (an engine's) inherit the lower priority; the thread ends with the call. A pool's
    thread is not used: it would stay lowered for whatever the pool runs next."""
    done: concurrent.futures.Future[T] = concurrent.futures.Future()

    def run() -> None:
        lower_thread(nice)
        try:
            result = fn()
        except BaseException as exc:
            if not done.cancelled():  # the caller gave up (a timeout): nobody reads it
                done.set_exception(exc)
        else:
            if not done.cancelled():
                done.set_result(result)

    threading.Thread(target=run, name="zeroserve-model-load", daemon=True).start()
    return await asyncio.wrap_future(done)


def raise_loop(priority: int) -> None:
    """Run the calling thread (the event loop's) in the real-time round-robin class at
    ``priority`` (1-99), so a woken loop takes its core from any normal thread at once.
    ``SCHED_RESET_ON_FORK``: the threads and processes it starts from now on (executor
    pools, an engine's threads, process workers) are normal threads again, so model work
    never runs real-time. The kernel's real-time throttle (``sched_rt_runtime_us``, by
    default 95 % of each second) still leaves normal threads some of a core should the
    loop ever spin. A no-op for 0; raises ``ConfigError`` where the class is not
    permitted (it needs CAP_SYS_NICE or ``ulimit -r`` of at least ``priority``) or not
    available (off Linux)."""
    if priority <= 0:
        return
    if not _PER_THREAD:
        raise ConfigError("loop_rt_priority needs Linux (real-time scheduling of one thread)")
    try:
        os.sched_setscheduler(0, os.SCHED_RR | os.SCHED_RESET_ON_FORK, os.sched_param(priority))
    except PermissionError:
        raise ConfigError(
            f"loop_rt_priority {priority} is not permitted: it needs CAP_SYS_NICE or a "
            f"real-time priority limit of at least {priority} (ulimit -r)"
        ) from None
