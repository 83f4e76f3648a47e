"""The token usage an OpenAI-compatible upstream reports, read from the relayed bytes.

Strategy
--------
The gateway relays an upstream's answer as it came
(docs/decisions/0019-relay-counts-stream-tokens.md), so the tokens of a relayed request
are known only from the upstream's own ``usage`` object: the top-level ``"usage": {...}``
of a JSON answer, or of a stream's chunk (OpenAI sends it in the last chunk when the
client asked for ``stream_options.include_usage``; some servers repeat a cumulative one on every chunk).
``UsageScanner.feed`` searches each relayed buffer in place with one bounded regular
expression (C speed, no copy of the body) and keeps the last usage seen; the relay
counts it as soon as it is read (a stream's later, larger cumulative one: the
difference), before the bytes after it reach the client. An object split across two reads is joined
from a small bounded carry (copied, counted at site ``relay_usage``). An answer without a
usage (``"usage": null``, a raw model's bytes) counts nothing.

Anthropic's Messages API reports ``input_tokens`` (plus ``cache_read_input_tokens`` and
``cache_creation_input_tokens``, not included in it) and ``output_tokens``; its stream
reports them in ``message_start`` and then, cumulative, in ``message_delta``, which may
carry the output alone. So the scanner keeps the largest input and the largest output
seen, and the tokens are their sum (or a larger ``total_tokens``): for OpenAI's usage,
reported once or repeated cumulative, that is the last one's total.
"""

from __future__ import annotations

import re

import msgspec

from ... import metrics

Buffer = bytes | bytearray | memoryview

# Longest usage object carried from one read into the next: OpenAI's, with its token
# details, is ~300 bytes; past this the split object is not a usage object we can read.
USAGE_MAX_BYTES = 4096

# ``"usage": {...}`` with at most one level of nested objects (the ``*_tokens_details``).
# An unescaped ``"usage"`` followed by ``:`` only occurs as a JSON key; inside a string
# its quotes would be escaped.
_USAGE = re.compile(rb'"usage"\s*:\s*(\{[^{}]*(?:\{[^{}]*\}[^{}]*)*\})')
_OPEN = re.compile(rb'"usage"\s*:\s*\{')
# The end of a buffer that may be the start of ``"usage": {`` (a key cut by a read).
_TAIL = re.compile(rb'"(?:u(?:s(?:a(?:g(?:e(?:"\s*(?::\s*)?)?)?)?)?)?)?\Z')
_TAIL_BYTES = 16


class _Usage(msgspec.Struct):
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    total_tokens: int | None = None
    input_tokens: int | None = None  # Anthropic's names from here on
    output_tokens: int | None = None
    cache_read_input_tokens: int | None = None
    cache_creation_input_tokens: int | None = None


_decode = msgspec.json.Decoder(_Usage).decode


def _usage(obj: Buffer) -> _Usage | None:
    try:
        usage = _decode(obj)
    except (msgspec.DecodeError, msgspec.ValidationError):
        return None
    counts = (usage.total_tokens, usage.prompt_tokens, usage.completion_tokens)
    if counts == (None, None, None) and usage.input_tokens is None and usage.output_tokens is None:
        return None  # no count we read (an object that only looks like a usage)
    return usage


class UsageScanner:
    """Feed it every relayed buffer in order; ``tokens`` is the usage's total so far."""

    __slots__ = ("_carry", "_input", "_output", "_total", "tokens")

    def __init__(self) -> None:
        self.tokens: int | None = None
        self._carry: bytes | None = None
        self._input = self._output = self._total = 0

    def feed(self, buf: Buffer) -> None:
        pos = 0
        carry = self._carry
        if carry is not None:  # finish the object the previous buffer began
            self._carry = None
            joined = carry + bytes(buf[:USAGE_MAX_BYTES])
            metrics.count_copy("relay_usage", len(joined))
            m = _USAGE.match(joined)
            if m is not None:
                self._record(joined, m)
                pos = max(0, m.end() - len(carry))
            elif len(buf) <= USAGE_MAX_BYTES:
                # Still incomplete (a short read), or no usage object: ``joined`` holds
                # all of ``buf``, so scanning it carries on what may still complete.
                self._scan(joined, 0)
                return
        self._scan(buf, pos)

    def _record(self, buf: Buffer, m: re.Match[bytes]) -> None:
        usage = _usage(buf[m.start(1) : m.end(1)])
        if usage is None:
            return
        given = (usage.prompt_tokens or 0) + (usage.input_tokens or 0)
        given += (usage.cache_read_input_tokens or 0) + (usage.cache_creation_input_tokens or 0)
        self._input = max(self._input, given)
        self._output = max(
            self._output, (usage.completion_tokens or 0) + (usage.output_tokens or 0)
        )
        self._total = max(self._total, usage.total_tokens or 0)
        self.tokens = max(self._total, self._input + self._output)

    def _scan(self, buf: Buffer, pos: int) -> None:
        end = pos
        for m in _USAGE.finditer(buf, pos):
            self._record(buf, m)
            end = m.end()
        last = None
        for last in _OPEN.finditer(buf, end):  # noqa: B007 (the last one is wanted)
            pass
        if last is not None:  # begun here, ended in the next buffer
            if len(buf) - last.start() <= USAGE_MAX_BYTES:
                self._carry = bytes(buf[last.start() :])
            return
        tail = _TAIL.search(buf, max(end, len(buf) - _TAIL_BYTES))
        if tail is not None:  # the key itself is cut: '..."usa' + 'ge": {...}'
            self._carry = bytes(buf[tail.start() :])
