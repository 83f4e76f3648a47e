"""Tasks waiting for a worker slot, shared by the process and Ray executors: a waiter
sleeps until the next ``wake_all()`` and then re-checks capacity itself, so a wake-up
never hands a slot over and a spurious one costs a check.

Invariant: a waiter that is cancelled leaves no future behind.
"""

from __future__ import annotations

import asyncio


class Waiters:
    """Tasks waiting for a worker slot: ``wait()`` until the next ``wake_all()``, when
    each re-checks capacity. Shared by the process and Ray executors."""

    __slots__ = ("_futs",)

    def __init__(self) -> None:
        self._futs: list[asyncio.Future[None]] = []

    def wake_all(self) -> None:
        futs, self._futs = self._futs, []
        for fut in futs:
            if not fut.done():
                fut.set_result(None)

    async def wait(self) -> None:
        fut = asyncio.get_running_loop().create_future()
        self._futs.append(fut)
        try:
            await fut
        finally:
            if fut in self._futs:
                self._futs.remove(fut)
