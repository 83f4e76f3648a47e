"""The worker protocol, shared by the ``process`` and ``ray`` executors: a model served
in another process over a stream socket, its payloads in the shared arena.

* :mod:`.wire`: the control frames between the two sides;
* :mod:`.link`: the server side of one connection (:class:`~.link.WorkerLink`: its
  calls, descriptors, leases, credits and hang timers), owned by an executor;
* :mod:`.loop`: the worker side (:class:`~.loop.WorkerLoop`), which a spawned process
  worker and a same-node Ray actor both run.

The ``process`` and ``ray`` packages depend on this one, never on each other.
"""
