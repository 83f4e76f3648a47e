"""Per-key quotas on an injected clock: no sleeps, exact refill arithmetic."""

from __future__ import annotations

import pytest

from zeroserve.edge import ApiKey, KeyLimits, KeyQuota, TokenBucket
from zeroserve.edge.quotas import CONCURRENCY_RETRY_AFTER_S, format_duration
from zeroserve.errors import RateLimited


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def headers_of(exc: RateLimited) -> dict[bytes, bytes]:
    return dict(exc.headers)


def test_bucket_refills_linearly_up_to_capacity() -> None:
    clock = Clock()
    b = TokenBucket(60, clock)  # one per second
    b.debit(60)
    b.refill()
    assert b.level == 0 and b.wait_for(1) == pytest.approx(1.0)
    clock.now += 30
    b.refill()
    assert b.level == pytest.approx(30)
    clock.now += 1000
    b.refill()
    assert b.level == 60 and b.reset_seconds() == 0


def test_requests_per_minute_reach_429_with_the_refill_time() -> None:
    clock = Clock()
    quota = KeyQuota(ApiKey("alice", b"k", KeyLimits(requests_per_minute=3)), clock)
    for _ in range(3):
        quota.admit()
    quota.release()
    with pytest.raises(RateLimited) as info:
        quota.admit()
    exc = info.value
    h = headers_of(exc)
    # 3 per minute refill one request every 20 s: that is the wait, to the second.
    assert exc.status == 429 and exc.retry_after == pytest.approx(20.0)
    assert h[b"retry-after"] == b"20" and h[b"retry-after-ms"] == b"20000"
    assert h[b"x-ratelimit-limit-requests"] == b"3"
    assert h[b"x-ratelimit-remaining-requests"] == b"0"
    assert h[b"x-ratelimit-reset-requests"] == b"1m0s"
    assert b"x-ratelimit-limit-tokens" not in h
    clock.now += 5
    with pytest.raises(RateLimited) as info:
        quota.admit()
    assert info.value.retry_after == pytest.approx(15.0)
    clock.now += 15
    quota.admit()
    quota.release()
    stats = quota.statistics()
    assert (stats.requests, stats.rejected, stats.rejected_requests) == (4, 2, 2)


def test_concurrency_reaches_429_and_frees_on_release() -> None:
    quota = KeyQuota(ApiKey("bob", b"k", KeyLimits(max_concurrent=2)), Clock())
    quota.admit()
    quota.admit()
    with pytest.raises(RateLimited) as info:
        quota.admit()
    assert info.value.retry_after == CONCURRENCY_RETRY_AFTER_S
    assert headers_of(info.value)[b"retry-after"] == b"1"
    assert "2 requests in flight" in info.value.message
    quota.release()
    quota.admit()
    assert quota.statistics().in_flight == 2
    quota.release()
    quota.release()
    assert quota.statistics().in_flight == 0
    # A release with nothing held is a bug in its caller: refused, never a negative count.
    with pytest.raises(RuntimeError, match="released more requests than admitted"):
        quota.release()
    assert quota.statistics().in_flight == 0


def test_tokens_per_minute_are_debited_as_produced_and_refused_in_debt() -> None:
    clock = Clock()
    quota = KeyQuota(ApiKey("carol", b"k", KeyLimits(tokens_per_minute=600)), clock)
    quota.admit()
    quota.debit_tokens(100)  # the prompt
    for _ in range(60):  # a stream of 600 completion tokens, 10 per piece
        quota.debit_tokens(10)
    quota.release()
    with pytest.raises(RateLimited) as info:
        quota.admit()
    h = headers_of(info.value)
    # 700 spent of 600: 100 in debt, +1 to admit, at 10 tokens/s -> 10.1 s.
    assert info.value.retry_after == pytest.approx(10.1)
    assert h[b"retry-after"] == b"11" and h[b"retry-after-ms"] == b"10100"
    assert h[b"x-ratelimit-limit-tokens"] == b"600"
    assert h[b"x-ratelimit-remaining-tokens"] == b"0"
    assert h[b"x-ratelimit-reset-tokens"] == b"1m10s"
    clock.now += 10.1
    quota.admit()
    quota.release()
    assert quota.statistics().tokens == 700
    assert quota.statistics().rejected_tokens == 1


def test_admitted_requests_carry_the_remaining_counts() -> None:
    clock = Clock()
    quota = KeyQuota(
        ApiKey("d", b"k", KeyLimits(requests_per_minute=10, tokens_per_minute=1000)), clock
    )
    quota.admit()
    quota.release()
    h = dict(quota.headers())
    assert h[b"x-ratelimit-remaining-requests"] == b"9"
    assert h[b"x-ratelimit-reset-requests"] == b"6s"
    assert h[b"x-ratelimit-remaining-tokens"] == b"1000"
    assert h[b"x-ratelimit-reset-tokens"] == b"0s"


def test_an_unlimited_key_is_counted_and_never_refused() -> None:
    quota = KeyQuota(ApiKey("e", b"k"), Clock())
    for _ in range(1000):
        quota.admit()
    for _ in range(1000):
        quota.debit_tokens(5)
        quota.release()
    assert quota.headers() == []
    assert quota.statistics().requests == 1000 and quota.statistics().tokens == 5000


@pytest.mark.parametrize(
    ("seconds", "text"),
    [(0, b"0s"), (0.0201, b"21ms"), (1, b"1s"), (59.2, b"1m0s"), (360, b"6m0s")],
)
def test_duration_format(seconds: float, text: bytes) -> None:
    assert format_duration(seconds) == text
