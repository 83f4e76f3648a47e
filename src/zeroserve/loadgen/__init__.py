"""``zeroserve bench URL``: a small load generator for any running OpenAI, KServe V2 or
raw endpoint, zeroserve's or another server's (``docs/architecture.md``,
"Benchmarks").

It opens ``-c`` keep-alive connections, sends ``-n`` requests (or for ``--duration``
seconds), and reports req/s, tokens/s, time to first token, inter-token latency and
request latency percentiles, and errors by status, as a table or ``--json``; ``--plot``
draws them (matplotlib, the ``bench`` extra). It needs nothing beyond the product: the
HTTP/1.1 client is the standard library's asyncio streams (:mod:`.client`), so installing
zeroserve is enough to measure any server.

* :mod:`.client`: one keep-alive HTTP/1.1 connection, each body piece timed on arrival;
* :mod:`.endpoints`: the request each ``--endpoint`` sends, and how its answer's tokens
  are counted;
* :mod:`.run`: the bounded load loop and the progress bar;
* :mod:`.summary`: percentiles, the table, the JSON and the plot.

The comparative benchmark against other servers is not here: it is ``make bench``
(``benchmarks/`` at the repository root, not in the wheel).
"""

from __future__ import annotations

from .cli import add_arguments, main

__all__ = ["add_arguments", "main"]
