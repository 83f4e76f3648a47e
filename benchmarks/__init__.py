"""The comparative benchmark of zeroserve against its peers: ``make bench`` (``python -m
benchmarks``) writes BENCHMARKS.md and ``bench-results/``.

Not part of the zeroserve package (it is not in the wheel). It drives every server as a
subprocess over 127.0.0.1 and imports, from zeroserve, only the public Model API
(``zeroserve.Model``, ``zeroserve.GenerateRequest``, the built-in models under
``zeroserve.models``) for the bench models the servers load and the peers that run the
same models. The exceptions are ``scripts/measure_overhead.py``, which times the
gateway's own upstream client in-process, and ``scripts/edge_key_cost.py``, which times
the edge's API-key check (the EDGE suite runs it as a process of its own).

How results are judged is recorded in ``docs/decisions/0012-paired-ab-for-small-differences.md``,
``docs/decisions/0013-tail-percentiles-per-round-and-stolen-cpu.md`` and
``docs/decisions/0014-latency-probes-at-real-time.md``. The pieces:

* ``machine.py``: machine facts (CPU, memory, versions, each part's CPU time stolen by the
  hypervisor: ``CpuTimes``) and CPU pinning (server CPU 0, load CPU 1, an upstream's CPU
  2; judged against the CPUs usable when it is imported, because the harness then pins
  itself to CPU 1 and everything it starts would inherit that; ``tests/test_pinning.py``);
* ``procs.py``: starting a process, waiting for its health path, CPU and RSS accounting of
  its tree, stopping it by PID;
* ``servers.py``: the one server type (``Server``: command line, health path, environment,
  upstream, ``tls``), zeroserve, the peers, ``with_tls`` (a server on HTTPS with the run's
  self-signed certificate), ``started()``;
* ``runner.py``: the one measuring loop (``measure``: a checked request, warm-up, wrk under
  accounting, probes, strace) and the A-B-A-B ``run_grid`` of runs;
  ``ZSBENCH_BASELINE_SRC`` adds a zeroserve from another tree to W1, W2, W3 and RAY
  (``servers.at_baseline``) for an A/B of a change in the same rounds;
* ``paired.py``: the paired A/B of two servers that differ by a few percent (``run_pairs``:
  both side by side, started afresh every 5 pairs, alternating 1 s wrk slices or,
  ``together``, both loaded at the same time; the median of the per-pair ratios with its
  95 % interval and quartiles), used by EDGE's API-key comparison;
* ``stats.py``: the one percentile (linear interpolation) and median;
* ``report.py``: table cells, targets, footers, and the one merger into BENCHMARKS.md (per
  group and suite markers, hand-written text outside them kept);
* ``wrk.py``, ``probe.py``, ``streamclient.py``: wrk with a Lua body, the first-event
  probe, the bounded asyncio stream client;
* ``peers/``, ``models.py``: the same endpoints on FastAPI, granian, aiohttp; the bench
  models the servers load;
* ``suites/``: one module per suite, and the catalog (``suites/__init__.py``);
* ``scripts/``: one-off measurements that print (not part of ``make bench``): the relay's
  client overhead, tinyllm's decode speed, the edge's key check in-process and in a whole
  server's instructions under callgrind, the cyclic GC's pauses in a served process, this
  tree against another by paired slices;
* ``tests/``: the harness's tests (run by ``make test``);
* ``HISTORY.md``: the dated runs behind BENCHMARKS.md, the A/B controls and the runs
  they replaced.
"""
