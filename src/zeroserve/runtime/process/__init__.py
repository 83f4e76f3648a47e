"""The ``process`` executor's room: spawned workers that share the arena.

* :mod:`.executor`: the server side (:class:`~.executor.ProcessExecutor`), one
  :class:`~.executor.WorkerProcess` per spawned worker;
* :mod:`.worker`: the worker side (the spawned process's serving loop);
* :mod:`.wire`: the control frames between the two.
"""

from .executor import ProcessExecutor

__all__ = ["ProcessExecutor"]
