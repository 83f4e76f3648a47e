"""Turns (server/turns.py): the loop-wide share of stream work per loop iteration, and a
new client's head served while many streams run, over real sockets."""

from __future__ import annotations

import asyncio
import socket
import threading

import uvloop

from tests.server.inproc import serving
from tests.support import scaled
from tests.support.models.raw import Endless
from zeroserve.server.options import ServerOptions
from zeroserve.server.turns import Turns


def _run(coro):  # type: ignore[no-untyped-def]
    return uvloop.run(coro)


def test_a_spent_turn_queues_writers_and_the_next_turn_wakes_them_in_order() -> None:
    async def scenario() -> list[int]:
        loop = asyncio.get_running_loop()
        turns = Turns(loop, budget_s=1.0)
        assert not turns.over()
        turns.charge(0.5)
        assert not turns.over()  # still within the budget
        turns.charge(1.0)
        assert turns.over()
        woken: list[int] = []

        async def writer(i: int) -> None:
            await turns.wait()
            woken.append(i)

        tasks = [asyncio.create_task(writer(i)) for i in range(3)]
        await asyncio.sleep(0)  # every writer is queued now
        assert turns.waiting == 3 and turns.over()  # a newcomer queues behind them
        await asyncio.gather(*tasks)  # no one charges again: the turns still come
        assert not turns.over()
        return woken

    assert _run(scenario()) == [0, 1, 2]


def test_a_turn_lets_as_many_writers_go_as_its_budget_fits() -> None:
    async def scenario() -> list[list[int]]:
        loop = asyncio.get_running_loop()
        turns = Turns(loop, budget_s=0.0)  # a batch spends the turn: one writer a turn
        turns.charge(0.001)
        rounds: list[list[int]] = []
        woken: list[int] = []

        async def writer(i: int) -> None:
            await turns.wait()
            woken.append(i)

        tasks = [asyncio.create_task(writer(i)) for i in range(4)]
        while len(woken) < 4:
            before = len(woken)
            await asyncio.sleep(0)
            if len(woken) > before:
                rounds.append(woken[before:])
        await asyncio.gather(*tasks)
        return rounds

    assert _run(scenario()) == [[0], [1], [2], [3]]


def test_a_cancelled_writer_is_skipped() -> None:
    async def scenario() -> list[int]:
        loop = asyncio.get_running_loop()
        turns = Turns(loop, budget_s=0.0)
        turns.charge(0.001)
        woken: list[int] = []

        async def writer(i: int) -> None:
            await turns.wait()
            woken.append(i)

        tasks = [asyncio.create_task(writer(i)) for i in range(3)]
        await asyncio.sleep(0)
        tasks[0].cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        assert turns.waiting == 0
        return woken

    assert _run(scenario()) == [1, 2]


STREAMS = 32
BATCH = 128  # STREAM_BATCH_PIECES: one batch of one stream


def _new_client(port: int, sent_at: list[int], first_event: threading.Event) -> None:
    """A new client on its own thread (blocking socket): connect, note how many pieces
    the running streams have made, send, read until the first event."""
    with socket.create_connection(("127.0.0.1", port), timeout=scaled(30)) as sock:
        sent_at.append(Endless.made)
        sock.sendall(
            b"POST /v1/raw/endless HTTP/1.1\r\nHost: t\r\nAccept: text/event-stream\r\n"
            b"Content-Length: 3\r\n\r\nnew"
        )
        seen = b""
        while b"data: x" not in seen:
            chunk = sock.recv(65536)
            if not chunk:
                break
            seen += chunk
    first_event.set()


def test_new_head_is_served_before_the_running_streams_write_their_next_batch() -> None:
    """32 endless streams run; a new connection's head is read and its stream started
    while the running streams made fewer pieces than one batch each (without turns, a
    loop iteration runs a batch of every stream between the poll that accepts the new
    connection and the one that reads its head)."""

    async def scenario() -> tuple[int, int]:
        # A zero budget: one batch a turn, so the bound below holds on any machine's speed
        # (with no turns at all, the same test counts a batch of every stream).
        options = ServerOptions(port=0, turn_budget_s=0.0)
        async with serving({"endless": Endless}, options) as server:
            stop = asyncio.Event()
            clients: list[asyncio.StreamWriter] = []

            async def reader(r: asyncio.StreamReader) -> None:
                while not stop.is_set() and await r.read(1 << 16):
                    pass

            readers = []
            try:
                for _ in range(STREAMS):
                    r, w = await asyncio.open_connection("127.0.0.1", server.port)
                    w.write(
                        b"POST /v1/raw/endless HTTP/1.1\r\nHost: t\r\n"
                        b"Accept: text/event-stream\r\nContent-Length: 3\r\n\r\nold"
                    )
                    clients.append(w)
                    readers.append(asyncio.create_task(reader(r)))
                # Every old stream is under way before the new client comes.
                loop = asyncio.get_running_loop()
                deadline = loop.time() + 30
                while Endless.made < 4 * STREAMS * BATCH:
                    assert loop.time() < deadline, "the old streams never got under way"
                    await asyncio.sleep(0.01)
                sent_at: list[int] = []
                first_event = threading.Event()
                thread = threading.Thread(
                    target=_new_client, args=(server.port, sent_at, first_event), daemon=True
                )
                thread.start()
                # Waited on a thread, so the loop keeps serving the streams meanwhile.
                assert await asyncio.to_thread(first_event.wait, 30), "no first event"
                thread.join(scaled(10))
                assert sent_at and Endless.new_started_at is not None
                return sent_at[0], Endless.new_started_at
            finally:
                stop.set()
                for w in clients:
                    w.close()
                for t in readers:
                    t.cancel()
                await asyncio.gather(*readers, return_exceptions=True)

    Endless.made, Endless.new_started_at = 0, None
    sent, started = _run(scenario())
    assert started >= sent
    assert started - sent < STREAMS * BATCH // 2
