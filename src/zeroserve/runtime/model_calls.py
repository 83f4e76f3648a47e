"""Calling a model's code, the same way in every executor: making the model from its
factory, awaiting what may or may not be awaitable, waiting out a pool thread, turning
the model's exception into the caller's error, and checking its outputs (and keeping the
arena leases behind them).

Invariants
----------
* A model's exception never reaches a client with its text: the client gets its type,
  the log gets the whole story (``model_failure``).
* A pool thread's call counts as running until the thread returned, even once its caller
  was cancelled (``run_to_end``): that is how hung work is seen.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from ..errors import WorkerError, ZeroserveError
from ..models.base import Model
from .arena import Arena, Lease
from .tensors import arena_offset

log = logging.getLogger("zeroserve.runtime")


def make_model(factory: Callable[..., Model], options: Mapping[str, Any]) -> Model:
    """Instantiate a model: a Model class gets ``options`` as keyword arguments; any
    other callable is called with them if there are any, else with none."""
    if isinstance(factory, type) or options:
        return factory(**options)
    return factory()


async def run_to_end(fut: asyncio.Future[Any]) -> Any:
    """Await a pool thread's future. Cancelled, it still waits for the thread to return
    before re-raising: a thread cannot be stopped, and whoever waits on this call must see
    it as running until its thread is free again (that is how hung work is detected)."""
    try:
        return await asyncio.shield(fut)
    except asyncio.CancelledError as exc:
        cancelled = exc  # awaited after the handler, as compiled code must
        # (docs/decisions/0009-no-await-in-handlers-when-compiled.md)
    if not fut.done():
        await asyncio.wait({fut})
    raise cancelled


async def maybe_await(value: Any) -> Any:
    if inspect.isawaitable(value):
        return await value
    return value


def model_failure(name: str, exc: BaseException) -> ZeroserveError:
    """A model's exception as the error the caller gets: ours pass through, others 500."""
    if isinstance(exc, ZeroserveError):
        return exc
    # The exception's text may quote the request's input, and error bodies never echo
    # input: the client gets the exception's type, the log gets the whole story.
    log.error("model %r failed", name, exc_info=exc)
    return WorkerError(f"model {name!r} failed: {type(exc).__name__}")


def output_leases(arena: Arena, outputs: Mapping[str, Any]) -> list[Lease]:
    """Retain the arena leases that back any output arrays (an echo returns its input's
    own memory), so the caller may release the request body independently."""
    leases: list[Lease] = []
    for value in outputs.values():
        if not isinstance(value, np.ndarray):
            continue
        off = arena_offset(value, arena.address, arena.size)
        if off is None:
            continue
        lease = arena.lease_containing(off, value.nbytes)
        if lease is not None and all(lease is not x for x in leases):
            leases.append(lease.retain())
    return leases


def check_outputs(name: str, batch_size: int, outputs: Any) -> Sequence[Mapping[str, Any]]:
    if type(outputs) is not list and not isinstance(outputs, Sequence):  # list: the fast check
        raise WorkerError(f"model {name!r} returned {type(outputs).__name__}, not a list")
    if len(outputs) != batch_size:
        got = len(outputs) if isinstance(outputs, Sequence) else type(outputs).__name__
        raise WorkerError(f"model {name!r} returned {got} outputs for a batch of {batch_size}")
    return outputs
