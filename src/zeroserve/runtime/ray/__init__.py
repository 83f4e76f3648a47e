"""The ``ray`` executor's room: model workers on Ray (docs/architecture.md, "Executors:
ray", "Elastic: executor=ray-serve").

* :mod:`.executor`: the one Ray executor (:class:`~.executor.RayExecutor`) and its
  strategy, the :class:`~.executor.Fleet`;
* :mod:`.actors`: the ``ray`` fleet, named Ray actors;
* :mod:`.serve`: the ``ray-serve`` fleet (its ingress side) and its replicas (Ray side);
* :mod:`.roster`: this side of each worker (:class:`~.roster.RayWorkerHandle`), routing;
* :mod:`.supervision`: faults and restarts, hung work, links, the cluster watch;
* :mod:`.marshal`: payloads to and from actors, every copy counted;
* :mod:`.producer`: one stream (:class:`~.producer.RayProducer`) under credits;
* :mod:`.actor`: the actor side (:class:`~.actor.RayWorker`, arena attach);
* :mod:`.placement`: the ``placement`` options (resources, restarts, ``same_node``);
* :mod:`.cluster`: joining, or starting and stopping, Ray.

Same-node actors speak the worker protocol of :mod:`..worker` over a link.
"""

from .executor import RayExecutor

__all__ = ["RayExecutor"]
