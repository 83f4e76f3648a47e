"""Joining Ray: one connection per server process, shared by its ``executor="ray"`` models.

With an address (``--ray-address``, ``[runtime] ray_address``, or ``RAY_ADDRESS``, which
Ray reads itself) the process joins that cluster and leaves it at exit. Without one,
zeroserve starts a local Ray (no dashboard) and shuts it down with the last model that
used it, so one command still works on a laptop. The local Ray's workers get this
process's ``sys.path``, as spawned process workers do, so a model importable here is
importable in its actors.
"""

from __future__ import annotations

import os
import sys
import threading
from typing import Any

# Ray namespace of zeroserve's named actors (see ``executor.actor_name``).
NAMESPACE = "zeroserve"
# The node address a local Ray (one zeroserve starts, or a cluster named by a loopback
# address) registers: loopback, so none of its sockets is reached through another
# interface. Ray on Linux otherwise swaps 127.0.0.1 for the host's first routable address
# (``services.resolve_ip_for_localhost``) unless its single-machine mode is on, which is
# what this variable (read once, when ``ray`` is first imported) selects.
LOOPBACK = "127.0.0.1"
SINGLE_MACHINE_ENV = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"


def _is_loopback(address: str) -> bool:
    host = address.removeprefix("ray://").rsplit(":", 1)[0].strip("[]")
    return host in ("localhost", "::1") or host.startswith("127.")


_lock = threading.Lock()
_users = 0
_owned = False


def connect(address: str | None) -> None:
    """Join (or start) Ray for one more user; blocking, call it off the event loop."""
    global _users, _owned
    target = address or os.environ.get("RAY_ADDRESS") or None
    local = target is None or _is_loopback(target)
    if local and "ray" not in sys.modules:
        os.environ.setdefault(SINGLE_MACHINE_ENV, "0")
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
            if local:
                kwargs["_node_ip_address"] = LOOPBACK
            ray.init(address=target, **kwargs)
            _owned = True
        _users += 1


def disconnect() -> None:
    """One user fewer; the last one leaves the cluster (stopping a local Ray it started)."""
    global _users, _owned
    import ray

    with _lock:
        _users = max(0, _users - 1)
        if _users == 0 and _owned:
            _owned = False
            ray.shutdown()
