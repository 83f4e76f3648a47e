"""``executor=ray-serve``: a model served by an autoscaling Ray Serve deployment, through
the one Ray executor (docs/architecture.md, "Elastic: executor=ray-serve").

The two sides of the process boundary are apart:

* :mod:`.ingress`: in the server, the executor's fleet (``ServeFleet``: deploying,
  calling the deployment's handle, slots, health) and ``serve_executor``;
* :mod:`.replica`: in Ray, the replica class (``ServeReplica``) and the streams'
  ``StreamControl`` actor;
* :mod:`.deployment`: the deployment as Serve sees it (autoscaling options, building the
  application, reading its health), used by the ingress.

Nothing is imported here: a replica imports :mod:`.replica` without the ingress's side.
"""
