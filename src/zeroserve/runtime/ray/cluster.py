"""Joining Ray: one connection per server process, shared by its ``executor="ray"`` models.

With an address (``--ray-address``, ``[runtime] ray_address``, or ``RAY_ADDRESS``, which
Ray reads itself) the process joins that cluster and leaves it at exit. Without one,
zeroserve starts a local Ray (no dashboard) and shuts it down with the last model that
used it, so one command still works on a laptop. The local Ray's workers get this
process's ``sys.path``, as spawned process workers do, so a model importable here is
importable in its actors.

A cluster that goes away must not take the ingress with it, nor leave requests waiting
for their deadline. Ray's driver exits the whole process once it has failed to reach the
GCS for ``gcs_rpc_server_reconnect_timeout_s`` (60 s by default); zeroserve raises that
limit (``GCS_RECONNECT_TIMEOUT_S``) and watches the cluster itself instead: ``reachable``
opens a TCP connection to the GCS and to this node's raylet, which the executors call
every ``PROBE_INTERVAL_S`` to turn a lost cluster into an immediate 503 with
``Retry-After`` (docs/architecture.md, "Executors: ray").
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import threading
from typing import Any

from ...models.native_signals import keep_signal_handlers

# Ray namespace of zeroserve's named actors (see ``actors.actor_name``).
NAMESPACE = "zeroserve"
# The node address a local Ray (one zeroserve starts, or a cluster named by a loopback
# address) registers: loopback, so none of its sockets is reached through another
# interface. Ray on Linux otherwise swaps 127.0.0.1 for the host's first routable address
# (``services.resolve_ip_for_localhost``) unless its single-machine mode is on, which is
# what this variable (read once, when ``ray`` is first imported) selects.
LOOPBACK = "127.0.0.1"
SINGLE_MACHINE_ENV = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"
# Ray's driver kills its process when the GCS stays unreachable this long (its default is
# 60 s). The ingress must outlive its cluster, answering 503 meanwhile, so the limit is
# raised to a year unless the operator set the variable; ``reachable`` does the watching.
GCS_RECONNECT_ENV = "RAY_gcs_rpc_server_reconnect_timeout_s"
GCS_RECONNECT_TIMEOUT_S = 365 * 24 * 3600
# Ray's metrics through OpenTelemetry, off in this process unless the operator set the
# variable: each ``ray.init`` starts an OpenTelemetry metric reader thread
# (``PeriodicExportingMetricReader``) that ``ray.shutdown`` never stops (Ray 2.60), so a
# server that joins and leaves Ray as its Ray models come and go gained a thread a round.
# Off, Ray's metrics from this process take its OpenCensus path, whose one harvester
# thread serves every round (docs/decisions/0058-load-unload-cycles.md).
OPEN_TELEMETRY_ENV = "RAY_enable_open_telemetry"
# How often an executor checks that its cluster is there, and how long one TCP connect
# to the GCS or the raylet may take before the cluster counts as gone: a refused
# connection is seen at once, an unreachable host after this timeout.
PROBE_INTERVAL_S = 0.5
PROBE_TIMEOUT_S = 2.0
# The Retry-After of a request refused while the cluster is unreachable: a few probes.
RETRY_AFTER_S = 5.0
# Ray's settings for a local Ray that zeroserve starts itself (a cluster joined by
# address keeps its own). Its idle processes share the ingress's cores: no workers
# started ahead of any actor (each idle one costs about 1 % of a core on this machine's
# cores, measured), and no Ray metrics (zeroserve exports its own), which Ray otherwise
# records on every call in the ingress and the actors and ships to its agent.
LOCAL_SYSTEM_CONFIG: dict[str, Any] = {
    "enable_worker_prestart": False,
    "prestart_worker_first_driver": False,
    "enable_metrics_collection": False,
}
# The server's drain signals, whose C-level handlers Ray's core worker replaces: joining
# installs its failure handler on SIGTERM (print a stack, then die of the signal) and
# leaving resets SIGTERM to the default action, so a server that joined or left at run
# time would be killed by SIGTERM instead of draining. Both are wrapped in
# ``keep_signal_handlers``, which restores them from any thread (``ray.init`` only sets
# its own Python handler on the main thread).
KEPT_SIGNALS = (signal.SIGINT, signal.SIGTERM)


def _is_loopback(address: str) -> bool:
    host = address.removeprefix("ray://").rsplit(":", 1)[0].strip("[]")
    return host in ("localhost", "::1") or host.startswith("127.")


_lock = threading.Lock()
_users = 0
_owned = False
# The (host, port) of the GCS and of this node's raylet, read once connected.
_endpoints: tuple[tuple[str, int], ...] = ()


def connect(address: str | None) -> None:
    """Join (or start) Ray for one more user; blocking, call it off the event loop."""
    global _users, _owned, _endpoints
    target = address or os.environ.get("RAY_ADDRESS") or None
    local = target is None or _is_loopback(target)
    if local and "ray" not in sys.modules:
        os.environ.setdefault(SINGLE_MACHINE_ENV, "0")
    os.environ.setdefault(GCS_RECONNECT_ENV, str(GCS_RECONNECT_TIMEOUT_S))
    os.environ.setdefault(OPEN_TELEMETRY_ENV, "0")
    import ray

    with _lock:
        if _users == 0 and not ray.is_initialized():
            kwargs: dict[str, Any] = {
                "namespace": NAMESPACE,
                "include_dashboard": False,
                "logging_level": "WARNING",
                "log_to_driver": False,
                "configure_logging": False,
            }
            if target is None:
                path = os.pathsep.join(p for p in sys.path if p)
                kwargs["runtime_env"] = {"env_vars": {"PYTHONPATH": path}}
                kwargs["_system_config"] = dict(LOCAL_SYSTEM_CONFIG)
            if local:
                kwargs["_node_ip_address"] = LOOPBACK
            with keep_signal_handlers(KEPT_SIGNALS):
                ray.init(address=target, **kwargs)
            _owned = True
            _endpoints = _find_endpoints()
        _users += 1


def local_node() -> str:
    """This process's Ray node id ("" when not joined): actors with the same one run on
    this machine."""
    import ray

    return ray.get_runtime_context().get_node_id() if ray.is_initialized() else ""


def _split(address: str) -> tuple[str, int]:
    host, _, port = address.rpartition(":")
    return host.strip("[]"), int(port)


def _find_endpoints() -> tuple[tuple[str, int], ...]:
    """The GCS's address and this node's raylet's (blocking; right after ``ray.init``)."""
    import ray

    ctx = ray.get_runtime_context()
    found = [_split(ctx.gcs_address)]
    node = ctx.get_node_id()
    for info in ray.nodes():  # type: ignore[no-untyped-call]
        if info.get("NodeID") == node:
            found.append((str(info["NodeManagerAddress"]), int(info["NodeManagerPort"])))
    return tuple(found)


async def reachable() -> bool:
    """Whether the GCS and this node's raylet accept a TCP connection (the cluster is
    there); True when nothing is known to probe."""
    for host, port in _endpoints:
        try:
            _, writer = await asyncio.wait_for(asyncio.open_connection(host, port), PROBE_TIMEOUT_S)
        except (OSError, TimeoutError):
            return False
        writer.close()
    return True


def disconnect() -> None:
    """One user fewer; the last one leaves the cluster (stopping a local Ray it started)."""
    global _users, _owned, _endpoints
    import ray

    with _lock:
        _users = max(0, _users - 1)
        if _users == 0 and _owned:
            _owned = False
            _endpoints = ()
            with keep_signal_handlers(KEPT_SIGNALS):
                ray.shutdown()
