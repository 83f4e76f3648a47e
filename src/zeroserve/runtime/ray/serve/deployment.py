"""A model's Serve deployment as Serve sees it: its autoscaling options, building its
application, and reading its health (docs/architecture.md, "Elastic: executor=ray-serve").

Strategy
--------
The model runs in the replicas of one Serve deployment with an ``autoscaling_config``
(``min_replicas``, ``max_replicas``, ``target_ongoing_requests``, Serve's delays and
intervals, ``max_ongoing_requests``: spec options, checked by ``parse_autoscaling``).
zeroserve stays the HTTP ingress: Serve is started with its proxy disabled
(``start_serve``) and the application, ``zeroserve-<ingress pid>-<model>``
(``app_name``), has no route. Serve health-checks each replica every
``HEALTH_CHECK_PERIOD_S``; the ingress reads the deployment's health from
``serve.status()`` (``read_health``).

Invariants
----------
* Everything that talks to Serve's controller here blocks: call it off the event loop.
* Models of one ingress start Serve, build their deployments and read Serve's status one
  at a time (``serve_lock``): building a deployment registers modules with cloudpickle
  process-wide, and Serve's client is process-wide too.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import Enum
from typing import TYPE_CHECKING, Any

from ..actor import ArenaRef
from .replica import ServeReplica, StreamControl

if TYPE_CHECKING:
    from ...arena import Arena
    from ...options import ResolvedModel
    from ..placement import Placement

# Spec options of ``executor=ray-serve`` read here (the rest of ``placement`` is the
# replicas' Ray placement, as for ``executor=ray``).
AUTOSCALING_KEYS = frozenset(
    {
        "min_replicas",
        "max_replicas",
        "target_ongoing_requests",
        "upscale_delay_s",
        "downscale_delay_s",
        "look_back_period_s",
        "metrics_interval_s",
        "max_ongoing_requests",
    }
)
# Requests a replica takes at once before Serve queues at the handle (Serve's default).
DEFAULT_MAX_ONGOING_REQUESTS = 5
# How often Serve health-checks each replica (Serve's default is 10 s): a replica that
# died is noticed, and its replacement started, within about this. One small actor call
# per replica per period.
HEALTH_CHECK_PERIOD_S = 2.0
# The deployment states Serve reports in which it serves (scaling included).
SERVING_STATES = frozenset({"HEALTHY", "UPSCALING", "DOWNSCALING"})
# Replica states that no longer count as one of the deployment's replicas.
GONE_REPLICA_STATES = frozenset({"STOPPING", "STOPPED"})


@dataclass(frozen=True, slots=True)
class DeploymentHealth:
    """A deployment's health as Serve reported it last: whether it serves, and its
    replicas (all that are not stopping) and running ones."""

    serving: bool
    replicas: int
    running: int


def deployment_health(status: str, replica_states: Mapping[str, int]) -> DeploymentHealth:
    """The health of a deployment in ``status`` (Serve's ``DeploymentStatus``) with
    ``replica_states`` (Serve's count of replicas by ``ReplicaState``)."""
    running = sum(n for state, n in replica_states.items() if state == "RUNNING")
    replicas = sum(n for state, n in replica_states.items() if state not in GONE_REPLICA_STATES)
    return DeploymentHealth(status in SERVING_STATES and running > 0, replicas, running)


def _state(value: object) -> str:
    """A Serve status or replica state as its name: Serve's own enums (``str`` ones)
    in some places, their plain values in others (``serve.status()`` in Ray 2.60)."""
    return str(value.value) if isinstance(value, Enum) else str(value)


# What a deployment that Serve does not list counts as (deleted, or not deployed yet).
MISSING = DeploymentHealth(False, 0, 0)


@dataclass(frozen=True, slots=True)
class Autoscaling:
    min_replicas: int = 1
    max_replicas: int = 1
    max_ongoing_requests: int = DEFAULT_MAX_ONGOING_REQUESTS
    config: Mapping[str, float] = field(default_factory=dict)


def parse_autoscaling(options: Mapping[str, Any]) -> Autoscaling:
    """The deployment's autoscaling from the spec options; ``ValueError`` names the
    option at fault."""

    def number(key: str, default: float, *, integer: bool) -> float:
        value = options.get(key, default)
        ok = isinstance(value, int) or (not integer and isinstance(value, float))
        if isinstance(value, bool) or not ok or value < 0:
            kind = "a non-negative integer" if integer else "a non-negative number"
            raise ValueError(f"{key} must be {kind}, not {value!r}")
        return value  # type: ignore[no-any-return]

    lo = int(number("min_replicas", 1, integer=True))
    hi = int(number("max_replicas", max(1, lo), integer=True))
    if hi < max(1, lo):
        raise ValueError(f"max_replicas ({hi}) must be >= max(1, min_replicas={lo})")
    ongoing = int(number("max_ongoing_requests", DEFAULT_MAX_ONGOING_REQUESTS, integer=True))
    if ongoing < 1:
        raise ValueError("max_ongoing_requests must be at least 1")
    config: dict[str, float] = {"min_replicas": lo, "max_replicas": hi}
    for key in (
        "target_ongoing_requests",
        "upscale_delay_s",
        "downscale_delay_s",
        "look_back_period_s",
        "metrics_interval_s",
    ):
        if key in options:
            config[key] = number(key, 0.0, integer=False)
    return Autoscaling(lo, hi, ongoing, config)


# Models of one ingress load concurrently; they start (or connect to) Serve and build
# their deployments one at a time.
serve_lock = threading.Lock()


def start_serve() -> None:
    """Start Serve with its proxy disabled, or connect to the running one (blocking)."""
    import ray.exceptions as rex

    from ray import serve

    try:
        serve.start(proxy_location="Disabled")
    except rex.ActorAlreadyExistsError:  # another ingress process started it meanwhile
        serve.start(proxy_location="Disabled")


def app_name(model: str) -> str:
    """The Serve application of a model: unique per ingress process."""
    return f"zeroserve-{os.getpid()}-{model}"


def build_app(spec: ResolvedModel, placement: Placement, auto: Autoscaling, arena: Arena) -> Any:
    """The model's deployment of :class:`ServeReplica`, bound to its arguments: the
    application ``serve.run`` deploys (blocking; under ``serve_lock``)."""
    from ray import serve

    actor = placement.actor_options()
    deployment = serve.deployment(
        ServeReplica,
        name=spec.name,
        autoscaling_config=dict(auto.config),
        max_ongoing_requests=auto.max_ongoing_requests,
        health_check_period_s=HEALTH_CHECK_PERIOD_S,
        ray_actor_options={
            "num_cpus": actor["num_cpus"],
            "num_gpus": actor["num_gpus"],
            "resources": actor["resources"],
        },
    )
    ref: ArenaRef | None = None
    if placement.same_node == "auto":
        ref = ArenaRef(os.getpid(), arena.fd, arena.size, arena.token)
    return deployment.bind(  # type: ignore[attr-defined]
        spec.factory, dict(spec.options), spec.name, ref
    )


def start_control(app: str) -> Any:
    """The model's StreamControl actor, pinned to the ingress's node (blocking)."""
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    import ray

    here = NodeAffinitySchedulingStrategy(ray.get_runtime_context().get_node_id(), soft=False)
    return (
        ray.remote(StreamControl)
        .options(  # type: ignore[attr-defined]
            name=f"{app}-streams", num_cpus=0, scheduling_strategy=here
        )
        .remote()
    )


def read_health(app: str, name: str) -> DeploymentHealth:
    """The health of deployment ``name`` of application ``app`` from ``serve.status()``
    (blocking). Under the deploy lock: Serve's client is process-wide, and another model's
    deployment may be starting it or building on it from another thread."""
    from ray import serve

    with serve_lock:
        status = serve.status()
    application = status.applications.get(app)
    dep = None if application is None else application.deployments.get(name)
    if dep is None:
        return MISSING
    states = {_state(state): n for state, n in dep.replica_states.items()}
    return deployment_health(_state(dep.status), states)
