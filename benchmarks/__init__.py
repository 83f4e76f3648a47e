"""The comparative benchmark of zeroserve against its peers: ``make bench`` (``python -m
benchmarks``) writes BENCHMARKS.md and ``bench-results/``.

Not part of the zeroserve package (it is not in the wheel). It drives every server as a
subprocess over 127.0.0.1 and imports, from zeroserve, only the public Model API
(``zeroserve.Model``, ``zeroserve.GenerateRequest``, the built-in models under
``zeroserve.models``) for the bench models the servers load and the peers that run the
same models. The exceptions are ``scripts/measure_overhead.py``, which times the
gateway's own upstream client in-process, and ``scripts/edge_key_cost.py``, which times
the edge's API-key check (the EDGE suite runs it as a process of its own).
``docs/architecture.md`` ("Benchmarks") says
how the pieces fit:

* ``machine.py``: machine facts and CPU pinning; ``procs.py``: starting, accounting and
  stopping processes; ``servers.py``: the one server type, zeroserve and the peers;
* ``runner.py``: the one measuring loop (a fresh server, a checked request, wrk under
  accounting) and the grid of runs; ``stats.py``: the one percentile;
* ``report.py``: tables, targets and the one merger into BENCHMARKS.md;
* ``wrk.py``, ``probe.py``, ``streamclient.py``: the load generators and clients;
* ``peers/``: the same endpoints on FastAPI, granian, aiohttp; ``models.py``: bench models;
* ``suites/``: one module per suite, and the catalog (``suites/__init__.py``);
* ``scripts/``: one-off measurements that print (not part of ``make bench``);
* ``tests/``: the harness's tests (run by ``make test``).
"""
