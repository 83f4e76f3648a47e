"""The API key's own cost in the edge, timed in-process (docs/decisions/0011-api-key-cost.md).

Run: ``.venv/bin/python -m benchmarks.scripts.edge_key_cost [--json]`` from the repository
root. It times what the server runs for every request at the edge, ``Edge.start`` +
``Edge.admit`` + ``Edge.release_quota`` (the last only where the edge has an end to
keep), on W1 64 KiB's request head, once with no key configured and once with one key
that the request presents; the difference is the key's own cost. The EDGE suite runs it
in a process of its own pinned to the server CPU, and reports that cost beside the
unkeyed server's measured CPU per request.

Like ``measure_overhead.py`` it imports zeroserve internals (the edge), which the rest of
``benchmarks/`` never does; the harness only reads its JSON line.
"""

from __future__ import annotations

import argparse
import json
import math
import timeit
from collections.abc import Callable

from zeroserve.edge import Edge
from zeroserve.edge.keys import ApiKey
from zeroserve.edge.options import EdgeOptions

# The key the EDGE suite's keyed server is given (a benchmark value, never a secret).
DEFAULT_KEY = "sk-zeroserve-bench-0123456789abcdef"
PATH = "/v1/raw/echo"
# W1 64 KiB's request head as the server's parser hands it to the edge (lower-case names).
HEAD = [
    (b"host", b"127.0.0.1:8000"),
    (b"content-length", b"65536"),
    (b"content-type", b"application/octet-stream"),
]
# Calls per timing: 10-40 ms at 0.5-2 µs a call, far above the clock's resolution.
NUMBER = 20_000
# Timings taken; the best is kept, the one least disturbed by the rest of the machine.
REPEATS = 7

Headers = list[tuple[bytes, bytes]]


def _one_request(edge: Edge, headers: Headers) -> Callable[[], None]:
    """One request's pass through the edge, as a call to time."""

    def one() -> None:
        ctx = edge.start("POST", headers, PATH)
        edge.admit(ctx, PATH, "")
        if edge.needs_end:
            edge.release_quota(ctx)

    one()  # raises if the edge refuses the request (a wrong key would time a 401)
    return one


def measure(key: str) -> dict[str, float]:
    """µs per request with no key, with one key, and the key's own (the difference).

    The two are timed in turns, one timing of each per repeat, so that whatever else the
    machine runs disturbs both alike; timing all of one and then all of the other let a
    busy stretch land on one side only (a CI run under parallel tests once read the key
    as 0.14 µs *faster* than none). The best of each side's timings is kept."""
    plain = Edge(EdgeOptions())
    keyed = Edge(EdgeOptions(keys=(ApiKey("default", key.encode()),)))
    try:
        calls = (
            _one_request(plain, HEAD),
            _one_request(keyed, [*HEAD, (b"authorization", b"Bearer " + key.encode())]),
        )
        best = [math.inf, math.inf]
        for _ in range(REPEATS):
            for side, call in enumerate(calls):
                best[side] = min(best[side], timeit.timeit(call, number=NUMBER))
    finally:
        plain.close()
        keyed.close()
    plain_us, keyed_us = (t / NUMBER * 1e6 for t in best)
    return {
        "plain_us": plain_us,
        "keyed_us": keyed_us,
        "key_us": keyed_us - plain_us,
        "number": NUMBER,
        "repeats": REPEATS,
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--key", default=DEFAULT_KEY, help="the configured (and presented) key")
    p.add_argument("--json", action="store_true", help="print one JSON line")
    args = p.parse_args(argv)
    got = measure(args.key)
    if args.json:
        print(json.dumps(got))
    else:
        print(
            f"edge per request: {got['plain_us']:.2f} µs without a key, "
            f"{got['keyed_us']:.2f} µs with one; the key's own cost {got['key_us']:.2f} µs "
            f"(best of {REPEATS} x {NUMBER:,} calls)"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
