"""Time to first token and inter-token time of one stream, as its consumer sees them.

Strategy
--------
The consumer (the HTTP writer, or a handler collecting a whole answer) takes pieces in
*deliveries*: one awaited piece (``Stream.__anext__``), then every piece already ready
(``Stream.receive_batch_nowait``). A timestamp per piece would be the producer's, which
for worker processes lives in another process; the consumer's clock is the one users
feel. So the first delivery's wait is the time to first token, and each later wait is
spread evenly over the pieces it brought (a delivery of ``k`` pieces after ``g``
seconds records ``k`` gaps of ``g / k``). A gap is recorded when the next delivery
starts (or the stream ends), once the pieces taken with it are known.

Cost: one clock read and a few integer bumps per delivery, on the loop, lock-free
(``metrics.Latency``). See docs/architecture.md, "Live statistics".
"""

from __future__ import annotations

from ..metrics import GenerationMetrics
from .clock import Clock


class StreamTiming:
    __slots__ = ("_clock", "_first", "_gap", "_last", "_metrics", "_pieces")

    def __init__(self, metrics: GenerationMetrics, clock: Clock) -> None:
        self._metrics = metrics
        self._clock = clock
        self._last = clock()
        self._first = True
        self._gap = 0.0
        self._pieces = 0  # pieces of the delivery whose gap is not recorded yet

    def awaited(self) -> None:
        """One piece arrived through an awaited receive."""
        now = self._clock()
        metrics = self._metrics
        metrics.pieces += 1
        n = self._pieces
        if n:  # the previous delivery's gaps (flush(), inlined: this runs per piece)
            metrics.inter_piece.observe(self._gap / n, n)
        elif self._first:
            self._first = False
            metrics.first_piece.observe(now - self._last)
            self._last = now
            return
        self._gap = now - self._last
        self._last = now
        self._pieces = 1

    def ready(self, n: int) -> None:
        """``n`` more pieces were taken without waiting, with the last awaited one; or,
        before any piece was awaited, the stream's first delivery (the server takes a new
        stream's first pieces without waiting): its first piece is the time to first
        token, the others came with it."""
        if not n:
            return
        metrics = self._metrics
        metrics.pieces += n
        if self._first:
            self._first = False
            now = self._clock()
            metrics.first_piece.observe(now - self._last)
            self._last = now
            self._gap = 0.0
            self._pieces = n - 1  # they arrived with the first: gaps of 0
            return
        self._pieces += n

    def flush(self) -> None:
        """Record the pending delivery's gaps (called at the next delivery and at the end)."""
        if self._pieces:
            self._metrics.inter_piece.observe(self._gap / self._pieces, self._pieces)
            self._pieces = 0
