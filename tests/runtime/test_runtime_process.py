"""What only the process executor has: zero copy across the boundary, crash recovery,
per-stream credits. Real spawned workers, on asyncio and uvloop."""

from __future__ import annotations

import asyncio
import multiprocessing
import os
import socket
from multiprocessing import resource_tracker
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.runtime.helpers import counter, engine, flag, until
from tests.support import await_until
from tests.support.models.engine import Counter, Echo, Faulty
from tests.support.observe import release_fifo
from zeroserve import errors, metrics
from zeroserve.models.base import GenerateRequest


def _own_children(model: str) -> list[multiprocessing.process.BaseProcess]:
    """This test's worker processes still alive (workers are named zeroserve-MODEL-i;
    other suites' session-wide servers may run in the same interpreter)."""
    return [
        p
        for p in multiprocessing.active_children()
        if (p.name or "").startswith(f"zeroserve-{model}-")
    ]


def _fds() -> set[str]:
    return set(os.listdir("/proc/self/fd"))


async def _warm_loop() -> None:
    """Open and close one stream: libuv (uvloop) opens a reserve /dev/null descriptor on a
    loop's first stream and keeps it for the loop's life; it is not ours to count."""
    a, b = socket.socketpair()
    _, writer = await asyncio.open_unix_connection(sock=a)
    writer.close()
    await writer.wait_closed()
    a.close()
    b.close()


def test_zero_copy_echo_across_the_process_boundary(run: Any, arena: Any) -> None:
    async def main() -> None:
        async with engine("process", {"echo": {"factory": Echo}}, arena=arena) as eng:
            h = eng.model("echo")
            body = arena.allocate(1 << 20)
            data = np.frombuffer(body.view, dtype=np.uint8)
            data[:] = np.arange(body.length, dtype=np.uint64).astype(np.uint8)
            floats = np.frombuffer(body.view, dtype=np.float32)[:1024].reshape(32, 32)
            copied = metrics.copied_bytes()
            r = await h.infer(h.admit(), {"raw": data, "f": floats})
            assert metrics.copied_bytes() == copied  # nothing copied, either way
            out = r.outputs["raw"]
            assert out.ctypes.data == data.ctypes.data  # the worker answered in place
            assert np.array_equal(out, data)
            assert r.outputs["f"].shape == (32, 32) and r.outputs["f"].dtype == np.float32
            assert np.array_equal(r.outputs["f"], floats, equal_nan=True)
            assert len(r.leases) == 1 and r.leases[0] is body  # retained for the result
            body.release()
            assert arena.statistics().leases == 1  # the result still holds the body
            r.release()

    run(main())


def test_input_outside_the_arena_is_copied_once_and_counted(run: Any, arena: Any) -> None:
    async def main() -> None:
        async with engine("process", {"echo": {"factory": Echo}}, arena=arena) as eng:
            h = eng.model("echo")
            x = np.arange(1000, dtype=np.int64)
            before = metrics.copied_bytes("process_input")
            r = await h.infer(h.admit(), {"x": x})
            assert metrics.copied_bytes("process_input") - before == x.nbytes
            assert np.array_equal(r.outputs["x"], x)
            r.release()

    run(main())


def test_worker_crash_fails_in_flight_restarts_and_reclaims(
    run: Any, arena: Any, tmp_path: Path
) -> None:
    async def main() -> None:
        resource_tracker.ensure_running()  # spawn starts it once per interpreter
        await _warm_loop()
        fds = _fds()
        eng = engine("process", {"f": {"factory": Faulty}}, arena=arena)
        assert eng.status().started is False and eng.status().models == {}
        await eng.start()
        h = eng.model("f")
        assert eng.ready()
        up = eng.status().models["f"]
        assert up.ready and up.executor == "process" and up.workers == up.ready_workers == 1
        body = arena.allocate(4096)
        crash = np.frombuffer(body.view, dtype=np.uint8)
        with pytest.raises(errors.WorkerError, match=r"died \(exit code 3\)") as info:
            await h.infer(h.admit(), {"crash": crash})
        assert info.value.status >= 500
        assert not eng.ready()  # the outage is visible
        down = eng.status().models["f"]  # and says which model, for /ready's detail
        assert not down.ready and down.ready_workers == 0 and down.workers == 1
        body.release()
        assert arena.statistics().leases == 0  # the worker's references were reclaimed
        await until(eng.ready, "worker restarted")
        r = await h.infer(h.admit(), {"x": np.arange(4)})
        assert list(r.outputs["x"]) == [0, 1, 2, 3]
        r.release()
        # A crash mid-stream fails the stream after the pieces before it.
        hold = str(tmp_path / "crash-hold")
        os.mkfifo(hold)
        stream = h.generate(h.admit(), GenerateRequest(prompt=f"crash:{hold}"))
        assert await anext(stream) == "one"

        async def released() -> bool:
            return release_fifo(hold)

        await await_until(released, 30, "the worker to wait on its crash hold")
        with pytest.raises(errors.WorkerError, match="died"):
            await anext(stream)
        await until(eng.ready, "worker restarted again")
        stats = h.statistics()
        assert stats.workers.crashes == 2 and stats.workers.restarts == 2
        assert stats.queue.in_flight == 0
        await eng.aclose()
        assert not _own_children("f")  # reaped: no zombies
        leaked = {fd: os.readlink(f"/proc/self/fd/{fd}") for fd in _fds() - fds}
        assert not leaked, leaked  # no leaked descriptors
        assert arena.statistics().used == 0

    run(main())


def test_slow_stream_does_not_stall_other_streams_on_the_worker(run: Any, arena: Any) -> None:
    async def main() -> None:
        produced, closed = counter(), flag()
        models = {
            "c": {
                "factory": Counter,
                "options": {"produced": produced, "closed": closed},
                "workers": 1,
            }
        }
        async with engine("process", models, arena=arena, channel_capacity=4) as eng:
            h = eng.model("c")
            stalled = h.generate(h.admit(), GenerateRequest())  # never read
            await until(lambda: stalled.statistics().pending == 4, "stalled stream full")
            fast = h.generate(h.admit(), GenerateRequest(max_tokens=200))
            got = [p async for p in fast]
            assert got == [str(i) for i in range(200)]
            # The stalled stream used its credit and no more.
            assert stalled.statistics().pending == 4
            assert produced.value <= 200 + 4 + 1
            # And the worker still serves batches meanwhile.
            assert h.statistics().workers.streams == 1
            await stalled.aclose()
            await until(closed.is_set, "stalled generator closed")

    run(main())


def test_bytes_pieces_in_the_arena_stream_without_copy(run: Any, arena: Any) -> None:
    async def main() -> None:
        async with engine("process", {"echo": {"factory": Echo}}, arena=arena) as eng:
            h = eng.model("echo")
            body = arena.allocate(64)
            text = b"alpha beta gamma"
            body.view[: len(text)] = text
            body.shrink(len(text))
            raw = np.frombuffer(body.view, dtype=np.uint8)
            stream = h.generate(h.admit(), GenerateRequest(raw=raw, max_tokens=5))
            pieces = [bytes(p) async for p in stream]
            assert pieces == [b"alpha", b"beta", b"gamma", b"alpha", b"beta"]
            body.release()

    run(main())


def test_shutdown_reaps_workers(run: Any, arena: Any) -> None:
    async def main() -> None:
        eng = engine("process", {"echo": {"factory": Echo, "workers": 2}}, arena=arena)
        await eng.start()
        assert eng.statistics().models["echo"].workers.ready == 2
        results = await asyncio.gather(
            *(
                eng.model("echo").infer(eng.model("echo").admit(), {"x": np.full(3, i)})
                for i in range(8)
            )
        )
        for i, r in enumerate(results):
            assert list(r.outputs["x"]) == [i] * 3
            r.release()
        await eng.aclose()
        assert not eng.ready()
        assert not _own_children("echo")

    run(main())
