"""The channel on its own: both policies, both ends, on asyncio and uvloop."""

from __future__ import annotations

from typing import Any

import pytest

from zeroserve import errors
from zeroserve.runtime import Channel, StreamAborted


def test_block_policy_bounds_and_ends(run: Any) -> None:
    async def main() -> None:
        ch = Channel(2)
        ch.send_nowait("a")
        ch.send_nowait(b"bc")
        with pytest.raises(errors.WouldBlock):
            ch.send_nowait("d")
        assert ch.statistics().pending == 2 and ch.statistics().pending_bytes == 3
        assert await ch.__anext__() == "a"
        ch.send_nowait("d")
        ch.close(errors.UpstreamError("upstream went away"))
        assert [x async for x in _take(ch, 2)] == [b"bc", "d"]
        with pytest.raises(errors.UpstreamError):
            await ch.__anext__()
        with pytest.raises(StopAsyncIteration):
            await ch.__anext__()

    run(main())


async def _take(ch: Channel, n: int) -> Any:
    for _ in range(n):
        yield await ch.__anext__()


def test_consumer_close_breaks_the_producer(run: Any) -> None:
    async def main() -> None:
        ch = Channel(1)
        ch.send_nowait("x")
        await ch.aclose()
        with pytest.raises(errors.Broken):
            await ch.send("y")
        assert ch.statistics().pending == 0

    run(main())


def test_coalesce_merges_and_caps(run: Any) -> None:
    async def main() -> None:
        ch = Channel(2, policy="coalesce", byte_cap=10)
        for piece in ["a", "b", "c", "d"]:
            ch.send_nowait(piece)  # never blocks
        stats = ch.statistics()
        assert stats.pending == 2 and stats.coalesced == 2
        assert [x async for x in _take(ch, 2)] == ["a", "bcd"]
        with pytest.raises(StreamAborted):
            for _ in range(20):
                ch.send_nowait("x")
        with pytest.raises(StreamAborted):
            await ch.__anext__()
        assert ch.statistics().peak_pending_bytes <= 11

    run(main())
