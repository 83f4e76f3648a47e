"""A request's choices: ``n`` per prompt, each its own generation (docs/architecture.md,
"One chat path").

A backend admits one ticket per choice up front (so a request that cannot be queued
whole gets its 429 before any work) and hands the front end a :class:`Choices`: a
:class:`QueuedChoice` per choice, which owns its ticket until the choice starts and its
:class:`~.output.Output` takes it. A whole answer starts every choice at once
(:func:`collect_all`); a stream starts them one after another (clients merge chunks by
``index``, and one request then holds one slot of the model at a time). Whatever ends
the request, :meth:`Choices.release` returns the tickets of the choices never started.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

from ...runtime import ModelHandle, QueueWatch, Ticket
from ...runtime.classes import Priority
from .output import Collected, Output, collect

_T = TypeVar("_T")


def admit(handle: ModelHandle, count: int, priority: Priority) -> list[Ticket]:
    """``count`` tickets of ``handle``'s queue, of class ``priority``, or none:
    ``Overloaded`` (429) raised, the tickets already taken released."""
    tickets: list[Ticket] = []
    try:
        for _ in range(count):
            tickets.append(handle.admit(priority))
    except BaseException:
        for t in tickets:
            t.release()
        raise
    return tickets


class QueuedChoice:
    """One choice not started yet: its index and its ticket."""

    __slots__ = ("_start", "_ticket", "index")

    def __init__(self, index: int, ticket: Ticket, start: Callable[[int, Ticket], Output]) -> None:
        self.index = index
        self._ticket: Ticket | None = ticket
        self._start = start

    def start(self) -> Output:
        """Start the choice: its output owns the ticket from now on."""
        ticket, self._ticket = self._ticket, None
        assert ticket is not None, "a choice starts once"
        return self._start(self.index, ticket)

    def watch(self, watch: QueueWatch) -> None:
        """Tell ``watch`` when the choice waits for the model and when it starts."""
        assert self._ticket is not None
        self._ticket.watch = watch

    def release(self) -> None:
        """Release the ticket if the choice never started."""
        ticket, self._ticket = self._ticket, None
        if ticket is not None:
            ticket.release()


class Choices:
    """The choices of one request, in index order, and their prompt tokens (counted up
    front where the backend can; 0 where the answer reports them)."""

    __slots__ = ("pending", "prompt_tokens")

    def __init__(self, pending: list[QueuedChoice], prompt_tokens: int = 0) -> None:
        self.pending = pending
        self.prompt_tokens = prompt_tokens

    def release(self) -> None:
        """Return the tickets of the choices never started (called once, at the end)."""
        for p in self.pending:
            p.release()


async def collect_all(choices: Choices) -> list[Collected]:
    """Every choice, started at once and collected, in index order; the first failure
    cancels the others and is raised. The tickets of choices never started are released
    however this ends."""
    pending = choices.pending
    try:
        if len(pending) == 1:
            return [await collect(pending[0].start())]
        return await _all_or_none([_one(p) for p in pending])
    finally:
        choices.release()


async def _one(p: QueuedChoice) -> Collected:
    return await collect(p.start())


async def _all_or_none(coros: list[Coroutine[Any, Any, _T]]) -> list[_T]:
    """Run ``coros`` as tasks and return their results, in order; the first failure
    cancels the rest, is waited out with them, and is raised as the request's. What
    ``asyncio.TaskGroup`` does, without its ``async with`` (compiled code must not
    suspend in a handler: docs/decisions/0009-no-await-in-handlers-when-compiled.md)."""
    tasks = [asyncio.ensure_future(c) for c in coros]
    failure: BaseException | None = None
    try:
        return await asyncio.gather(*tasks)
    except BaseException as exc:  # a choice failed, or this request was cancelled
        failure = exc
    for task in tasks:
        task.cancel()
    await asyncio.wait(tasks)
    raise failure
