"""tests/support's waiting helpers: the one slowdown factor and the poll with a deadline."""

from __future__ import annotations

import asyncio
import itertools

import pytest

from tests.support import SLOWDOWN_VARIABLE, await_until, scaled, slowdown, wait_until


def test_scaled_multiplies_by_the_suite_factor(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(SLOWDOWN_VARIABLE, raising=False)
    assert slowdown() == 1.0
    assert scaled(2.0) == 2.0
    monkeypatch.setenv(SLOWDOWN_VARIABLE, "3")
    assert scaled(2.0) == 6.0


@pytest.mark.parametrize("raw", ["fast", "0.5", "nan"])
def test_a_bad_factor_is_refused_naming_the_variable(
    monkeypatch: pytest.MonkeyPatch, raw: str
) -> None:
    monkeypatch.setenv(SLOWDOWN_VARIABLE, raw)
    with pytest.raises(ValueError, match=SLOWDOWN_VARIABLE):
        slowdown()


def test_wait_until_returns_the_first_truthy_value() -> None:
    counter = itertools.count()
    assert wait_until(lambda: next(counter) >= 3 and "ready", 5.0, "the counter") == "ready"


def test_wait_until_names_what_it_waited_for(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(SLOWDOWN_VARIABLE, "1")
    with pytest.raises(AssertionError, match="waiting for the impossible"):
        wait_until(lambda: False, 0.0, "the impossible")


def test_await_until_polls_a_coroutine() -> None:
    counter = itertools.count()

    async def reached() -> bool:
        return next(counter) >= 2

    assert asyncio.run(await_until(reached, 5.0, "the counter")) is True
