"""What a wait's class queue costs per request: 64 requests pushed, then taken one at a
time (a batcher's queue at the default depth, batches of one), in one class (the common
case) and in 8 classes, against the ``deque`` the waits used before
(docs/decisions/0036-priority-classes-with-linear-aging.md). Prints; asserts nothing.

Run: ``.venv/bin/python -m benchmarks.scripts.class_queue_cost`` (pin it to a quiet
core with ``taskset -c 1``; the best of 7 rounds is reported, so a neighbour's burst
only ever makes a round slower).
"""

from __future__ import annotations

import random
import time
import timeit
from collections import deque
from collections.abc import Callable

from zeroserve.runtime.classes import ClassQueue

DEPTH = 64
ROUNDS = 7
CALLS = 2000


def _deque() -> None:
    q: deque[int] = deque()
    for i in range(DEPTH):
        q.append(i)
    while q:
        q.popleft()


def _classes(classes: list[int]) -> Callable[[], None]:
    def run() -> None:
        q: ClassQueue[int] = ClassQueue(time.monotonic)
        for i, c in enumerate(classes):
            q.push(i, c)
        while q:
            q.take(1)

    return run


def main() -> None:
    mixed = [random.Random(1).randrange(8) for _ in range(DEPTH)]
    cases = [
        ("deque (FIFO, before)", _deque),
        ("ClassQueue, one class", _classes([0] * DEPTH)),
        ("ClassQueue, 8 classes", _classes(mixed)),
    ]
    for name, fn in cases:
        best = min(timeit.repeat(fn, number=CALLS, repeat=ROUNDS)) / CALLS / DEPTH
        print(f"{name:24} {best * 1e9:6.0f} ns per request (push + take)")


if __name__ == "__main__":
    main()
