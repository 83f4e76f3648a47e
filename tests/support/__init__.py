"""Shared test support: one way to wait, scaled by the suite's slowdown factor.

Import as ``from tests.support import ...`` (the repository root is on pytest's ``pythonpath``).
"""

from tests.support.timing import SLOWDOWN_VARIABLE, await_until, scaled, slowdown, wait_until

__all__ = ["SLOWDOWN_VARIABLE", "await_until", "scaled", "slowdown", "wait_until"]
