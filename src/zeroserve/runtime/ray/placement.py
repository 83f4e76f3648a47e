"""Where a model's Ray actors run: the ``placement`` options of ``executor="ray"`` models,
checked once at load (docs/architecture.md, "Executors: ray").

Spec options (``mine=my_model:M?executor=ray&workers=2&num_cpus=1&resources={"node_b":1}``):

* ``num_cpus`` / ``num_gpus``: Ray's logical resources per actor;
* ``resources``: a JSON object of custom resources per actor (node affinity by resource);
* ``max_restarts``: how often Ray restarts a dead actor (``-1``: forever);
* ``same_node``: ``auto`` (attach the arena when the actor can: zero copy) or ``never``
  (always move payloads through Ray's object store, as across nodes).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

# An actor that dies is restarted by Ray this many times by default: enough to ride out
# a few bad requests, few enough that a model crashing on load does not loop forever.
DEFAULT_MAX_RESTARTS = 8
# A CPU model's actor reserves one logical CPU by default, as one process worker would.
DEFAULT_NUM_CPUS = 1.0

SameNode = Literal["auto", "never"]


@dataclass(frozen=True, slots=True)
class Placement:
    num_cpus: float = DEFAULT_NUM_CPUS
    num_gpus: float = 0.0
    resources: Mapping[str, float] = field(default_factory=dict)
    max_restarts: int = DEFAULT_MAX_RESTARTS
    same_node: SameNode = "auto"

    def actor_options(self) -> dict[str, Any]:
        """The options of ``ActorClass.options(...)``."""
        return {
            "num_cpus": self.num_cpus,
            "num_gpus": self.num_gpus,
            "resources": dict(self.resources),
            "max_restarts": self.max_restarts,
            # A restarted actor does not rerun the task that killed it: that request
            # already failed with 503 (the process executor's rule).
            "max_task_retries": 0,
        }


def _number(key: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
        raise ValueError(f"{key} must be a non-negative number, not {value!r}")
    return float(value)


def parse_placement(options: Mapping[str, Any]) -> Placement:
    """The :class:`Placement` of a model's ``placement`` options; ``ValueError`` names the
    option at fault."""
    known = {"num_cpus", "num_gpus", "resources", "max_restarts", "same_node"}
    unknown = sorted(set(options) - known)
    if unknown:
        raise ValueError(f"unknown Ray placement option(s): {', '.join(unknown)}")
    resources: dict[str, float] = {}
    raw = options.get("resources")
    if raw is not None:
        parsed = json.loads(raw) if isinstance(raw, str) else raw
        if not isinstance(parsed, dict):
            raise ValueError("resources must be a JSON object of resource name to amount")
        resources = {str(k): _number(f"resources[{k}]", v) for k, v in parsed.items()}
    restarts = options.get("max_restarts", DEFAULT_MAX_RESTARTS)
    if isinstance(restarts, bool) or not isinstance(restarts, int) or restarts < -1:
        raise ValueError(f"max_restarts must be an integer >= -1, not {restarts!r}")
    same_node = options.get("same_node", "auto")
    if same_node not in ("auto", "never"):
        raise ValueError(f"same_node must be 'auto' or 'never', not {same_node!r}")
    return Placement(
        num_cpus=_number("num_cpus", options.get("num_cpus", DEFAULT_NUM_CPUS)),
        num_gpus=_number("num_gpus", options.get("num_gpus", 0.0)),
        resources=resources,
        max_restarts=restarts,
        same_node=same_node,
    )
