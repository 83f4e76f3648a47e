"""Reading a ``/v1/stats`` document in tests, the way the page does."""

from __future__ import annotations

from typing import Any


def counter(doc: dict[str, Any], family: str, **labels: str) -> float:
    """The sum of ``family``'s counter values whose labels include ``labels``."""
    return sum(
        c["value"]
        for c in doc["counters"].get(family, [])
        if all(c["labels"].get(k) == v for k, v in labels.items())
    )


def histogram(doc: dict[str, Any], family: str, **labels: str) -> dict[str, Any]:
    """The one child of histogram ``family`` with exactly ``labels``."""
    (child,) = [h for h in doc["histograms"][family] if h["labels"] == labels]
    return dict(child)
