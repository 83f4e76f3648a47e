"""Priority classes: the order in which waiting requests get a model's capacity.

Strategy (docs/architecture.md, "Priority classes";
docs/decisions/0036-priority-classes-with-linear-aging.md)
--------------------------------------------------------------------------------------
A request carries a class, an integer :data:`Priority` (vLLM's meaning: lower runs
first; :data:`DEFAULT_PRIORITY` when nobody asked). Wherever requests wait for capacity
(a batcher's queue, an engine's slots) they wait in a :class:`ClassQueue`, which serves
the lowest *rank* first::

    rank = arrived + priority * aging_s

that is, a request's effective class improves by one every ``aging_s`` seconds it
waits (``priority - waited / aging_s``), and comparing two ranks is comparing effective
classes at any common instant. The rank never changes while the request waits, so the
queue is a plain sorted list (FIFO within a class, and FIFO overall when every class is
the same: the common case costs an append).

The bound: a request of class ``p`` that arrived at ``t`` is passed over only by
requests whose rank is lower, i.e. of a class ``q`` that arrived before
``t + (p - q) * aging_s``. No request that arrives later than ``(p - MIN_PRIORITY) *
aging_s`` after it (with the classes actually asked, ``(p - q_min) * aging_s``) can go
before it; from then on it waits only for the finite work already queued ahead (at
most the model's queue depth). ``aging_s = 0`` turns classes off: first come, first
served.

Invariants
----------
* Every item pushed leaves exactly once: by ``take``/``pop`` (it starts: its wait is
  counted in its class's ``started`` and ``waited_s``), or by ``remove`` (cancelled or
  expired: not counted as served).
* Only the event-loop thread touches a queue.
"""

from __future__ import annotations

import bisect
import itertools
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Final, Generic, TypeVar

from .clock import Clock

Priority = int
# A request that asks for nothing (vLLM's default).
DEFAULT_PRIORITY: Final = 0
# The classes a request or an API key may name. Bounded so that the starvation bound
# below is finite and stated, and so that a class is a small label value for metrics.
MIN_PRIORITY: Final = -1000
MAX_PRIORITY: Final = 1000
# The lowest class, what an OpenAI Batch API line runs at: it fills capacity that the
# interactive classes leave idle and yields it back to them, and still never starves: a
# batch line is passed over by default-class requests for at most
# (BATCH_PRIORITY - DEFAULT_PRIORITY) * DEFAULT_AGING_S = 1000 s (about 17 minutes,
# well inside the Batch API's 24 h completion window).
BATCH_PRIORITY: Final = MAX_PRIORITY
# Seconds of waiting worth one class: one class step per second. Adjacent classes then
# differ by at most a second of waiting (the interactive scale: an interactive request
# that has waited a second is already late), and the span of classes
# (MAX_PRIORITY - MIN_PRIORITY) bounds any pass-over at about 33 minutes
# (docs/decisions/0036-priority-classes-with-linear-aging.md).
DEFAULT_AGING_S: Final = 1.0

T = TypeVar("T")


def check_priority(value: int, what: str = "priority") -> Priority:
    """``value`` if it is a class a request may name, else ``ValueError`` naming ``what``
    and the range."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{what} must be an integer")
    if not MIN_PRIORITY <= value <= MAX_PRIORITY:
        raise ValueError(f"{what} must be between {MIN_PRIORITY} and {MAX_PRIORITY}")
    return value


def pass_over_bound_s(priority: Priority, highest: Priority, aging_s: float) -> float:
    """How long after its arrival a request of class ``priority`` can still be passed by
    a newcomer, when the highest class asked is ``highest`` (lowest number)."""
    return max(0, priority - highest) * aging_s


@dataclass(frozen=True, slots=True)
class ClassStatistics:
    """One class's waits in one or more queues (summed with :meth:`plus`)."""

    waiting: int  # requests waiting now
    longest_wait_s: float  # the longest current wait, seconds
    started: int  # cumulative: waits that ended with the request started
    waited_s: float  # cumulative: seconds those waits took

    def plus(self, other: ClassStatistics) -> ClassStatistics:
        return ClassStatistics(
            self.waiting + other.waiting,
            max(self.longest_wait_s, other.longest_wait_s),
            self.started + other.started,
            self.waited_s + other.waited_s,
        )


def merge_classes(
    parts: list[dict[Priority, ClassStatistics]],
) -> dict[Priority, ClassStatistics]:
    """Per-class statistics of several queues, summed class by class."""
    out: dict[Priority, ClassStatistics] = {}
    for part in parts:
        for cls, stats in part.items():
            have = out.get(cls)
            out[cls] = stats if have is None else have.plus(stats)
    return out


class _ClassCounts:
    """One class's counts in one queue (mutated in place: one lookup per operation)."""

    __slots__ = ("started", "waited_s", "waiting")

    def __init__(self) -> None:
        self.waiting = 0
        self.started = 0
        self.waited_s = 0.0


# A waiting item: (rank, sequence, its class's counts, arrival, item). Tuples compare in
# C, and the sequence is unique, so the comparison never reaches the counts or the item.
_Entry = tuple[float, int, _ClassCounts, float, T]


class ClassQueue(Generic[T]):
    """Items waiting for capacity, served lowest rank first (the module's docstring).
    ``T`` items are compared by identity for ``remove`` and ``in``."""

    __slots__ = ("_aging_s", "_clock", "_counts", "_entries", "_seq")

    def __init__(self, clock: Clock, aging_s: float = DEFAULT_AGING_S) -> None:
        if aging_s < 0:
            raise ValueError("aging_s must be at least 0")
        self._clock = clock
        self._aging_s = aging_s
        self._entries: list[_Entry[T]] = []
        self._seq = itertools.count()
        self._counts: dict[Priority, _ClassCounts] = {}

    @property
    def aging_s(self) -> float:
        return self._aging_s

    def __len__(self) -> int:
        return len(self._entries)

    def __bool__(self) -> bool:
        return bool(self._entries)

    def __iter__(self) -> Iterator[T]:
        """The items in the order they would be served."""
        return iter([e[4] for e in self._entries])

    def __contains__(self, item: object) -> bool:
        return any(e[4] is item for e in self._entries)

    def rank(self, priority: Priority, arrived: float) -> float:
        return arrived + priority * self._aging_s

    def push(self, item: T, priority: Priority, arrived: float | None = None) -> None:
        """Queue ``item`` of class ``priority``, waiting since ``arrived`` (now if None)."""
        when = self._clock() if arrived is None else arrived
        counts = self._counts.get(priority)
        if counts is None:
            counts = self._counts[priority] = _ClassCounts()
        counts.waiting += 1
        entry = (when + priority * self._aging_s, next(self._seq), counts, when, item)
        entries = self._entries
        if not entries or entries[-1][0] <= entry[0]:
            entries.append(entry)  # the common case: one class, arrivals in order
        else:
            bisect.insort(entries, entry)

    def peek(self) -> T:
        """The item that would be served next (``IndexError`` when empty)."""
        return self._entries[0][4]

    def pop(self) -> T:
        """Serve the best item: it starts now (``IndexError`` when empty)."""
        return self.take(1)[0]

    def take(self, n: int) -> list[T]:
        """Serve up to ``n`` best items, best first: they start now."""
        entries = self._entries
        if not entries:
            if n > 0:
                raise IndexError("take from an empty ClassQueue")
            return []
        taken = entries[:n]
        del entries[:n]
        now = self._clock()
        out: list[T] = []
        for _, _, counts, arrived, item in taken:
            counts.waiting -= 1
            counts.started += 1
            if now > arrived:
                counts.waited_s += now - arrived
            out.append(item)
        return out

    def remove(self, item: object) -> bool:
        """Take ``item`` out without serving it (cancelled, expired); False if absent."""
        entries = self._entries
        for i, e in enumerate(entries):
            if e[4] is item:
                del entries[i]
                e[2].waiting -= 1
                return True
        return False

    def remove_if(self, drop: Callable[[T], bool]) -> int:
        """Remove every item for which ``drop`` is true (in serving order); their count."""
        kept: list[_Entry[T]] = []
        dropped = 0
        for e in self._entries:
            if drop(e[4]):
                e[2].waiting -= 1
                dropped += 1
            else:
                kept.append(e)
        if dropped:
            self._entries = kept
        return dropped

    def oldest_arrival(self) -> float:
        """When the longest-waiting item arrived (``ValueError`` when empty)."""
        return min(e[3] for e in self._entries)

    def clear(self) -> list[T]:
        """Remove everything, unserved; the items, in serving order."""
        items = [e[4] for e in self._entries]
        for e in self._entries:
            e[2].waiting -= 1
        self._entries = []
        return items

    def statistics(self) -> dict[Priority, ClassStatistics]:
        """Per class (every class waiting now or ever started here): waiting now, the
        longest current wait, and the cumulative waits of those started."""
        now = self._clock()
        longest: dict[int, float] = {}
        for e in self._entries:
            key = id(e[2])
            w = now - e[3]
            if w > longest.get(key, -1.0):
                longest[key] = w
        return {
            cls: ClassStatistics(
                waiting=c.waiting,
                longest_wait_s=max(0.0, longest.get(id(c), 0.0)),
                started=c.started,
                waited_s=c.waited_s,
            )
            for cls, c in sorted(self._counts.items())
            if c.waiting or c.started
        }
