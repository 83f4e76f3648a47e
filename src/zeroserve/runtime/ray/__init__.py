"""The ``ray`` executor's room: model workers as Ray actors (docs/architecture.md,
"Executors: ray").

* :mod:`.executor`: the ingress side (:class:`~.executor.RayExecutor`);
* :mod:`.actor`: the actor side (:class:`~.actor.RayWorker`, arena attach);
* :mod:`.placement`: the ``placement`` options (resources, restarts, ``same_node``);
* :mod:`.cluster`: joining, or starting and stopping, Ray.
"""

from .executor import RayExecutor

__all__ = ["RayExecutor"]
