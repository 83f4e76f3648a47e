"""The ``process`` executor's room: spawned workers that share the arena.

* :mod:`.executor`: the server side (:class:`~.executor.ProcessExecutor`), one
  :class:`~.executor.WorkerProcess` per spawned worker;
* :mod:`.link`: the server side of one worker connection (:class:`~.link.WorkerLink`:
  its calls, descriptors, leases and credits), which same-node Ray actors use too;
* :mod:`.worker`: the worker side (the spawned process's serving loop);
* :mod:`.wire`: the control frames between the two.
"""

from .executor import ProcessExecutor

__all__ = ["ProcessExecutor"]
