"""The ``process`` executor's room: spawned workers that share the arena.

* :mod:`.executor`: the server side (:class:`~.executor.ProcessExecutor`), one
  :class:`~.executor.WorkerProcess` per spawned worker, each a
  :class:`~..worker.link.WorkerLink`;
* :mod:`.worker`: the spawned process's entry point, which serves the shared
  :class:`~..worker.loop.WorkerLoop`.

The frames, the link and the loop are the worker protocol's (:mod:`..worker`), which
same-node Ray actors speak too.
"""

from .executor import ProcessExecutor

__all__ = ["ProcessExecutor"]
