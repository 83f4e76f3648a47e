"""A model's state machine (docs/architecture.md, "Models at run time"): every allowed move, every refused one."""

from __future__ import annotations

import itertools

import pytest

from zeroserve.runtime.model_state import (
    TRANSITIONS,
    TRITON_STATE,
    ModelState,
    ModelStateMachine,
    StateError,
)

S = ModelState


def _machine_in(state: ModelState) -> ModelStateMachine:
    paths = {
        S.UNLOADED: [],
        S.LOADING: [S.LOADING],
        S.LOADED: [S.LOADING, S.LOADED],
        S.UNLOADING: [S.LOADING, S.LOADED, S.UNLOADING],
        S.FAILED: [S.LOADING, S.FAILED],
    }
    machine = ModelStateMachine()
    for step in paths[state]:
        machine.to(step, "boom" if step is S.FAILED else None)
    assert machine.state is state
    return machine


def test_a_model_loads_serves_unloads_and_counts_its_loads() -> None:
    machine = ModelStateMachine()
    assert machine.status.state is S.UNLOADED and machine.status.loads == 0
    machine.to(S.LOADING)
    failed = machine.to(S.FAILED, "file is corrupt")
    assert failed.reason == "file is corrupt" and failed.loads == 1
    machine.to(S.LOADING)
    assert machine.status.reason is None
    machine.to(S.LOADED)
    machine.to(S.UNLOADING)
    final = machine.to(S.UNLOADED)
    assert final.state is S.UNLOADED and final.loads == 2


@pytest.mark.parametrize(("old", "new"), list(itertools.product(S, S)))
def test_only_the_table_s_moves_are_allowed(old: ModelState, new: ModelState) -> None:
    machine = _machine_in(old)
    reason = "why" if new is S.FAILED else None
    if new in TRANSITIONS[old]:
        assert machine.to(new, reason).state is new
    else:
        with pytest.raises(StateError, match=f"from {old.value} to {new.value}"):
            machine.to(new, reason)
        assert machine.state is old


def test_a_reason_goes_with_failed_only() -> None:
    machine = _machine_in(S.LOADING)
    with pytest.raises(StateError, match="reason"):
        machine.to(S.FAILED)
    with pytest.raises(StateError, match="reason"):
        machine.to(S.LOADED, "not a failure")
    assert machine.state is S.LOADING


def test_triton_names_every_state() -> None:
    assert set(TRITON_STATE) == set(S)
    assert set(TRITON_STATE.values()) == {"READY", "UNAVAILABLE", "LOADING", "UNLOADING"}
