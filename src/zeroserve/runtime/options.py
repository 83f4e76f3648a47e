"""What configures the runtime: runtime-wide :class:`RuntimeOptions`, each served model's
:class:`ModelConfig`, and the :class:`ResolvedModel` the engine makes of the two."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from ..models.base import ExecutorKind, Model
from .admission import DEFAULT_QUEUE_DEPTH
from .channel import DEFAULT_CAPACITY, DEFAULT_COALESCE_CAP_BYTES
from .classes import DEFAULT_AGING_S
from .priority import DEFAULT_MODEL_NICE

# A sync generator on the inline executor hands the loop back at least every 16 pieces:
# at a few microseconds a piece that bounds a stall to well under a millisecond.
DEFAULT_YIELD_EVERY = 16
# A request's whole life (queueing + execution) when the caller gives no deadline. Five
# minutes covers a long generation on a small CPU model; anything longer is stuck.
DEFAULT_DEADLINE_S = 300.0
# How long start() waits for a model's load() (per model, workers load in parallel).
# Loading real weights from disk takes seconds; two minutes means "it is hung".
DEFAULT_LOAD_TIMEOUT_S = 120.0
# How long aclose() lets process workers exit on their own before they are killed.
DEFAULT_SHUTDOWN_TIMEOUT_S = 5.0
# Restart back-off for a crashed worker: first retry at once (crashes are usually one
# bad request), then doubling up to 5 s so a crash-looping model does not spin a core.
DEFAULT_RESTART_BACKOFF_S = 0.05
MAX_RESTART_BACKOFF_S = 5.0
# Seconds a call may run past its deadline before its slot (thread) or worker (process)
# counts as hung (docs/architecture.md, "Hung work"). Long enough for a model that checks
# its own deadline between steps to return; short enough that a hung process worker is
# back within seconds. A process worker killed for it reloads its model, so this errs on
# the patient side.
DEFAULT_HANG_GRACE_S = 5.0

EXECUTORS: tuple[ExecutorKind, ...] = ("inline", "thread", "process", "ray", "ray-serve")


@dataclass(frozen=True, slots=True)
class RuntimeOptions:
    """Runtime-wide defaults. Each is overridable; see the constants for the reasons."""

    default_deadline_s: float = DEFAULT_DEADLINE_S
    channel_capacity: int = DEFAULT_CAPACITY
    coalesce_cap_bytes: int = DEFAULT_COALESCE_CAP_BYTES
    queue_depth: int = DEFAULT_QUEUE_DEPTH
    load_timeout_s: float = DEFAULT_LOAD_TIMEOUT_S
    shutdown_timeout_s: float = DEFAULT_SHUTDOWN_TIMEOUT_S
    restart_backoff_s: float = DEFAULT_RESTART_BACKOFF_S
    max_restart_backoff_s: float = MAX_RESTART_BACKOFF_S
    inline_yield_every: int = DEFAULT_YIELD_EVERY
    # The Ray cluster ``executor="ray"`` models join ("auto", "ray://...", "host:port");
    # None: ``RAY_ADDRESS`` if set, else a local Ray started (and stopped) by zeroserve.
    ray_address: str | None = None
    hang_grace_s: float = DEFAULT_HANG_GRACE_S
    # Nice levels below the event loop that models' threads and worker processes run at
    # (runtime/priority.py); a model's ``nice`` option overrides it, 0 turns it off.
    model_nice: int = DEFAULT_MODEL_NICE
    # Seconds of waiting worth one priority class (runtime/classes.py); 0 serves every
    # wait first come, first served, whatever the classes asked.
    priority_aging_s: float = DEFAULT_AGING_S


@dataclass(frozen=True, slots=True)
class ModelConfig:
    """One served model. ``None`` fields fall back to the model class's attributes
    (``executor``, ``max_batch_size``, ``max_batch_delay_ms``, ``workers``) or to
    ``RuntimeOptions.queue_depth``.

    ``factory`` is a ``Model`` subclass (called with ``options`` as keyword arguments)
    or a callable returning a ``Model``. For the ``process`` executor it must be
    importable by name (a module-level class or function), since workers are spawned.
    """

    name: str
    factory: Callable[..., Model]
    options: Mapping[str, Any] = field(default_factory=dict)
    executor: ExecutorKind | None = None
    max_batch_size: int | None = None
    max_batch_delay_ms: float | None = None
    workers: int | None = None
    queue_depth: int | None = None
    # Ray placement of ``executor="ray"`` workers (num_cpus, num_gpus, resources,
    # max_restarts, same_node); see ``runtime.ray.placement``.
    placement: Mapping[str, Any] = field(default_factory=dict)
    # Seconds a request to this model may live at most (``RuntimeOptions.default_deadline_s``
    # when None); a per-request timeout can only shorten it.
    deadline_s: float | None = None
    # Nice levels below the event loop for this model's work (``RuntimeOptions.model_nice``
    # when None).
    nice: int | None = None


@dataclass(frozen=True, slots=True)
class ResolvedModel:
    """A served model as the runtime runs it: its :class:`ModelConfig` with every default
    resolved (from the model class and :class:`RuntimeOptions`)."""

    name: str
    factory: Callable[..., Model]
    options: Mapping[str, Any]
    executor: ExecutorKind
    max_batch_size: int
    max_batch_delay_ms: float
    workers: int
    queue_depth: int
    capabilities: frozenset[str]
    # The longest a request may live (queueing + execution), seconds: the model's
    # ``deadline_s`` option, else the runtime's default deadline.
    deadline_s: float
    placement: Mapping[str, Any] = field(default_factory=dict)
    # Nice levels below the event loop its threads and worker processes run at.
    nice: int = 0
