"""Per-key quotas: concurrent requests, requests per minute, tokens per minute.

Strategy
--------
Requests and tokens per minute are token buckets that hold one minute's allowance and
refill continuously (``limit / 60`` per second), on an injected clock. A request takes one
request token at its head. Tokens are not known at the head (the model counts them), so
admission only asks that the key's token bucket is not in debt; the prompt and then every
completion piece are debited as they are counted, and a bucket may go below zero. A key
that overspent waits until the refill has paid the debt back.

A refused request gets 429 with ``Retry-After`` (and ``retry-after-ms``, which the openai
SDK honours) computed from the refusing bucket's own refill time, plus OpenAI's
``x-ratelimit-{limit,remaining,reset}-{requests,tokens}`` headers. Admitted requests of a
limited key carry the same headers.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from ..errors import RateLimited
from .keys import ApiKey

Clock = Callable[[], float]
Headers = list[tuple[bytes, bytes]]

# Seconds a request refused for concurrency is told to wait. Concurrency has no refill
# time: a slot frees when one of the key's requests ends, which we cannot predict; one
# second is what the engine's admission says when it has no drain rate yet.
CONCURRENCY_RETRY_AFTER_S = 1.0
# The window the per-minute limits refer to, seconds.
MINUTE_S = 60.0


class TokenBucket:
    """``capacity`` tokens, refilled at ``capacity / window`` per second up to full."""

    __slots__ = ("_clock", "_updated", "capacity", "level", "rate")

    def __init__(self, capacity: int, clock: Clock, window: float = MINUTE_S) -> None:
        self.capacity = float(capacity)
        self.rate = capacity / window
        self.level = float(capacity)
        self._clock = clock
        self._updated = clock()

    def refill(self) -> float:
        """Bring the level up to now; return now."""
        now = self._clock()
        elapsed = now - self._updated
        if elapsed > 0:
            self.level = min(self.capacity, self.level + elapsed * self.rate)
        self._updated = now
        return now

    def wait_for(self, amount: float) -> float:
        """Seconds until ``amount`` tokens are available (0 if they are now)."""
        missing = amount - self.level
        return missing / self.rate if missing > 0 else 0.0

    def reset_seconds(self) -> float:
        """Seconds until the bucket is full again (OpenAI's ``x-ratelimit-reset-*``)."""
        return (self.capacity - self.level) / self.rate

    def debit(self, amount: float) -> None:
        self.level -= amount


@dataclass(frozen=True, slots=True)
class QuotaStatistics:
    in_flight: int
    requests: int
    tokens: int
    rejected: int
    rejected_concurrency: int
    rejected_requests: int
    rejected_tokens: int


class KeyQuota:
    """One key's limits and its usage. ``admit()`` takes a request or raises
    ``RateLimited``, ``release()`` ends it; every key is counted (requests, tokens),
    limited or not."""

    __slots__ = (
        "_in_flight",
        "_rejected",
        "_requests",
        "_tokens",
        "key",
        "limited",
        "max_concurrent",
        "request_bucket",
        "token_bucket",
    )

    def __init__(self, key: ApiKey, clock: Clock) -> None:
        self.key = key
        lim = key.limits
        self.max_concurrent = lim.max_concurrent
        self.request_bucket = (
            TokenBucket(lim.requests_per_minute, clock) if lim.requests_per_minute else None
        )
        self.token_bucket = (
            TokenBucket(lim.tokens_per_minute, clock) if lim.tokens_per_minute else None
        )
        self.limited = lim.limited
        self._in_flight = 0
        self._requests = 0
        self._tokens = 0
        self._rejected = {"concurrency": 0, "requests": 0, "tokens": 0}

    def admit(self) -> None:
        """Take one request: counted, and held until ``release()``; raises
        ``RateLimited`` if a limit refuses it. No object stands for the hold: its owner
        (the request's edge context) keeps the quota and releases it exactly once."""
        if not self.limited:  # counted only
            self._in_flight += 1
            self._requests += 1
            return
        rb, tb = self.request_bucket, self.token_bucket
        if rb is not None:
            rb.refill()
        if tb is not None:
            tb.refill()
        if self.max_concurrent is not None and self._in_flight >= self.max_concurrent:
            self._refuse(
                "concurrency",
                CONCURRENCY_RETRY_AFTER_S,
                f"API key '{self.key.name}' has {self._in_flight} requests in flight, "
                f"its limit is {self.max_concurrent}",
            )
        if rb is not None and rb.level < 1.0:
            self._refuse(
                "requests",
                rb.wait_for(1.0),
                f"API key '{self.key.name}' reached its limit of "
                f"{int(rb.capacity)} requests per minute",
            )
        if tb is not None and tb.level < 1.0:
            self._refuse(
                "tokens",
                tb.wait_for(1.0),
                f"API key '{self.key.name}' reached its limit of "
                f"{int(tb.capacity)} tokens per minute",
            )
        if rb is not None:
            rb.debit(1.0)
        self._in_flight += 1
        self._requests += 1

    def headers(self) -> Headers:
        """OpenAI's rate-limit headers for the key's current state (empty if unlimited)."""
        out: Headers = []
        for kind, bucket in (("requests", self.request_bucket), ("tokens", self.token_bucket)):
            if bucket is None:
                continue
            out.append((b"x-ratelimit-limit-" + kind.encode(), b"%d" % int(bucket.capacity)))
            out.append(
                (
                    b"x-ratelimit-remaining-" + kind.encode(),
                    b"%d" % max(0, math.floor(bucket.level)),
                )
            )
            out.append(
                (b"x-ratelimit-reset-" + kind.encode(), format_duration(bucket.reset_seconds()))
            )
        return out

    def debit_tokens(self, n: int) -> None:
        """Tokens the model counted for one of the key's requests (the prompt, then each
        completion piece)."""
        if n <= 0:
            return
        self._tokens += n
        if self.token_bucket is not None:
            self.token_bucket.refill()
            self.token_bucket.debit(n)

    def release(self) -> None:
        """One admitted request ended: its hold on the key's concurrency is dropped."""
        if self._in_flight <= 0:
            raise RuntimeError(f"API key '{self.key.name}': released more requests than admitted")
        self._in_flight -= 1

    def _refuse(self, reason: str, retry_after: float, message: str) -> None:
        self._rejected[reason] += 1
        ms = max(1, math.ceil(retry_after * 1000))
        raise RateLimited(
            message,
            retry_after=retry_after,
            headers=[(b"retry-after-ms", b"%d" % ms), *self.headers()],
        )

    def statistics(self) -> QuotaStatistics:
        r = self._rejected
        return QuotaStatistics(
            in_flight=self._in_flight,
            requests=self._requests,
            tokens=self._tokens,
            rejected=sum(r.values()),
            rejected_concurrency=r["concurrency"],
            rejected_requests=r["requests"],
            rejected_tokens=r["tokens"],
        )


def format_duration(seconds: float) -> bytes:
    """OpenAI's reset format: ``"250ms"``, ``"7s"``, ``"6m0s"``."""
    if seconds <= 0:
        return b"0s"
    if seconds < 1:
        return b"%dms" % max(1, math.ceil(seconds * 1000))
    whole = math.ceil(seconds)
    minutes, secs = divmod(whole, 60)
    return b"%dm%ds" % (minutes, secs) if minutes else b"%ds" % secs
