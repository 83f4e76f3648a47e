"""Time to first token and inter-token time (runtime/timing.py) on an injected clock,
and through a real engine stream."""

from __future__ import annotations

from typing import Any

from zeroserve import metrics
from zeroserve.metrics import GenerationMetrics, Latency
from zeroserve.models.base import GenerateRequest
from zeroserve.models.echo import EchoModel
from zeroserve.runtime import Engine, ModelConfig
from zeroserve.runtime.clock import ManualClock
from zeroserve.runtime.timing import StreamTiming


def counts(latency: Latency) -> dict[float, int]:
    """Observations by bucket bound (inf for the overflow bucket), non-zero ones only."""
    bounds = (*latency.bounds, float("inf"))
    return {b: n for b, n in zip(bounds, latency.counts, strict=True) if n}


def test_latency_buckets_follow_prometheus_le() -> None:
    lat = Latency((0.001, 0.01))
    lat.observe(0.001)  # on a bound: that bucket (le = "less or equal")
    lat.observe(0.005, 3)
    lat.observe(5.0)
    assert counts(lat) == {0.001: 1, 0.01: 3, float("inf"): 1}
    snap = lat.snapshot()
    assert snap.count == 5 and abs(snap.sum - (0.001 + 0.015 + 5.0)) < 1e-12


def test_first_wait_is_ttft_and_later_waits_are_spread_over_their_pieces() -> None:
    clock = ManualClock()
    gen = GenerationMetrics()
    timing = StreamTiming(gen, clock)
    clock.advance(0.2)
    timing.awaited()  # the first piece, 200 ms after the start
    assert counts(gen.first_piece) == {0.25: 1}
    clock.advance(0.008)
    timing.awaited()  # 8 ms later, and 3 more were ready with it
    timing.ready(3)
    assert gen.inter_piece.count == 0  # recorded once the delivery is complete
    clock.advance(0.02)
    timing.awaited()  # 20 ms, alone
    assert counts(gen.inter_piece) == {0.0025: 4}  # 8 ms over 4 pieces
    timing.flush()  # the stream ended
    assert counts(gen.inter_piece) == {0.0025: 4, 0.025: 1}
    assert gen.pieces == 6
    timing.flush()  # idempotent
    assert gen.inter_piece.count == 5


def test_a_first_delivery_taken_without_waiting_is_the_time_to_first_token() -> None:
    """The server takes a new stream's first pieces without awaiting (from the I/O
    callback that completed the request): that delivery is still the first piece."""
    clock = ManualClock()
    gen = GenerationMetrics()
    timing = StreamTiming(gen, clock)
    clock.advance(0.003)
    timing.ready(4)  # four ready at once, 3 ms after the start
    assert counts(gen.first_piece) == {0.005: 1}
    clock.advance(0.02)
    timing.awaited()  # 20 ms later, alone
    timing.flush()
    assert counts(gen.inter_piece) == {0.00005: 3, 0.025: 1}  # three came with the first
    assert gen.pieces == 5


def test_an_engine_stream_records_every_piece(run: Any) -> None:
    async def main() -> None:
        name = "echo-timing"
        engine = Engine({name: ModelConfig(name, EchoModel)})
        await engine.start()
        try:
            handle = engine.model(name)
            before = metrics.generation_metrics(name).pieces
            stream = handle.generate(handle.admit(), GenerateRequest(prompt="a b c", max_tokens=10))
            got = [piece async for piece in stream]
            gen = metrics.generation_metrics(name)
            assert len(got) == 10 and gen.pieces - before == 10
            assert gen.first_piece.count >= 1 and gen.inter_piece.count >= 9
            doc = metrics.snapshot()
            (pieces,) = [
                c["value"]
                for c in doc["counters"]["zeroserve_stream_pieces"]
                if c["labels"] == {"model": name}
            ]
            assert pieces == gen.pieces
            (ttft,) = [
                h
                for h in doc["histograms"]["zeroserve_stream_first_piece_seconds"]
                if h["labels"] == {"model": name}
            ]
            assert ttft["counts"] == list(gen.first_piece.counts)
        finally:
            await engine.aclose()

    run(main())
