"""A model's state at run time (docs/architecture.md, "Models at run time"), one state machine in one file.

States: ``unloaded`` -> ``loading`` -> ``loaded`` -> ``unloading`` -> ``unloaded``; a load
that fails ends in ``failed`` with its reason, from which a new load may start. The
transitions are the table ``TRANSITIONS``; any other move raises ``StateError``, so a
manager that races a load against an unload learns it at once instead of corrupting
state. Triton's names for the same states (the KServe V2 repository extension) are
``TRITON_STATE``.

Invariant: ``reason`` is set exactly when the state is ``failed``.

A loaded model whose engine child process died (``llamacpp`` with ``engine=process``)
stays ``loaded``: the engine still serves it, and the next request is served by a new
child, which the model starts at once. Until that child answers, its snapshot's
``fault`` says why it cannot serve (clients read it as ``failed`` with that reason), and
the model is not ready. ``fault`` is set only on a ``loaded`` snapshot, by the manager.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass


class ModelState(enum.Enum):
    UNLOADED = "unloaded"
    LOADING = "loading"
    LOADED = "loaded"
    UNLOADING = "unloading"
    FAILED = "failed"


# state -> states it may move to
TRANSITIONS: dict[ModelState, frozenset[ModelState]] = {
    ModelState.UNLOADED: frozenset({ModelState.LOADING}),
    ModelState.LOADING: frozenset({ModelState.LOADED, ModelState.FAILED}),
    ModelState.LOADED: frozenset({ModelState.UNLOADING}),
    ModelState.UNLOADING: frozenset({ModelState.UNLOADED}),
    ModelState.FAILED: frozenset({ModelState.LOADING, ModelState.UNLOADED}),
}

# Triton's model repository states, as tritonclient reads them.
TRITON_STATE: dict[ModelState, str] = {
    ModelState.UNLOADED: "UNAVAILABLE",
    ModelState.LOADING: "LOADING",
    ModelState.LOADED: "READY",
    ModelState.UNLOADING: "UNLOADING",
    ModelState.FAILED: "UNAVAILABLE",
}


class StateError(RuntimeError):
    """A transition the table does not allow (a programming error in the caller)."""


@dataclass(frozen=True)
class ModelStateSnapshot:
    """An immutable snapshot of one model's state."""

    state: ModelState
    reason: str | None = None
    loads: int = 0  # loads started, failed ones included
    # A new version loads or serves while the old one finishes its work (the manager
    # sets it; runtime/model_replace.py). The state stays ``loaded`` throughout.
    replacing: bool = False
    # Why a loaded model cannot serve now (its engine's child process died and no new one
    # answers yet); the manager sets it from the engine. None: it can.
    fault: str | None = None


class ModelStateMachine:
    """The state of one model; every move goes through ``to``."""

    def __init__(self) -> None:
        self._status = ModelStateSnapshot(ModelState.UNLOADED)

    @property
    def status(self) -> ModelStateSnapshot:
        return self._status

    @property
    def state(self) -> ModelState:
        return self._status.state

    def to(self, new: ModelState, reason: str | None = None) -> ModelStateSnapshot:
        """Move to ``new``; ``reason`` is required for ``failed`` and refused otherwise."""
        old = self._status
        if new not in TRANSITIONS[old.state]:
            raise StateError(f"model state cannot go from {old.state.value} to {new.value}")
        if (new is ModelState.FAILED) != (reason is not None):
            raise StateError("a reason goes with the failed state, and only with it")
        loads = old.loads + (new is ModelState.LOADING)
        self._status = ModelStateSnapshot(new, reason, loads)
        return self._status
