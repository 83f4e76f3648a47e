"""Peer servers: the same benchmark endpoints on the stacks users run today.

Each peer is a module runnable as ``python -m benchmarks.peers.<name> --port P`` that
serves on 127.0.0.1 in one process. They implement the `echo` model's behaviour exactly as
zeroserve's endpoints do, so every scenario drives both with the same request:

* ``GET /health`` -> 200.
* ``POST /v1/raw/echo``: the body back; with ``Accept: text/event-stream`` one SSE event
  ``data: <token>\\n\\n`` per whitespace-separated token of the body.
* ``POST /v1/completions``: OpenAI text completions over the echo model (prompt tokens,
  cycled up to ``max_tokens``), streamed as ``text_completion`` chunks then ``[DONE]``.

Peers are the buffered designs users write: the whole body is read, every chunk built as
its own object and written on its own.
"""
