"""A relayed stream's tokens counted from its chunks, for when its upstream reports no
usage.

Strategy
--------
A relayed chat or completion stream's tokens are the upstream's own usage chunk, but an
upstream that refuses ``stream_options`` never sends one, nor does one that ignores it
(docs/architecture.md, "The edge"); the key's tokens per minute and the access log must
still count the stream, or it streams past the quota. So the relay counts the chunks as
they pass, and a usage, when one comes, replaces that count once it is larger. The
rule, an estimate: **one token per non-empty generated string a chunk carries**: a
``"content"`` (a chat delta), ``"text"`` (a completion choice), ``"reasoning_content"``
or ``"reasoning"`` (a reasoning delta) or ``"arguments"`` (a tool call's delta) whose
value is a string of at least one character. OpenAI-compatible servers stream about one
token per chunk, so this is the completion's length (low for a server that sends several
tokens a chunk); the prompt's tokens are not known and not counted.

``DeltaCounter.feed`` searches each relayed buffer in place with one regular expression
(C speed, no copy of the body): an unescaped ``"content"`` followed by ``:`` only occurs
as a JSON key, and a value of ``"`` and one more character that is not ``"`` is a
non-empty string (an array or object, such as ``logprobs.content``, does not match). A
key cut by a read is found by carrying the buffer's last bytes that may begin one (at
most ``DELTA_MAX_BYTES``, copied and counted at site ``relay_deltas``) into the next; a
read that ends with a line end (as a server's reads of whole events do) cuts none, since
a chunk's JSON is on one ``data:`` line. The usage is read from the same buffers
(``UsageScanner``). Like ``UsageScanner``, ``tokens`` is cumulative: the relay counts
its increase as soon as a buffer is read, before the buffer goes to the client, so a
stream's tokens are debited as they are produced.
"""

from __future__ import annotations

import re

from ... import metrics
from ._usage import UsageScanner

Buffer = bytes | bytearray | memoryview

# The longest match of ``_DELTA``: ``"reasoning_content"`` (19 bytes), up to 16 bytes of
# whitespace on each side of the ``:``, the value's ``"`` and its first byte (54), with
# room to spare. A key cut by a read is carried over at most this many bytes.
DELTA_MAX_BYTES = 64

_KEYS = rb"(?:content|text|reasoning_content|reasoning|arguments)"
_WS = rb"[ \t\r\n]{0,16}"
# A non-empty string value of one of the keys: one token of the estimate.
_DELTA = re.compile(rb'"' + _KEYS + rb'"' + _WS + rb":" + _WS + rb'"[^"]')
_LF = 0x0A
# The end of a buffer that may be the start of a match (a superset: the carry is then
# checked with ``_DELTA`` itself).
_PARTIAL = re.compile(rb'"[a-z_]{0,17}(?:"' + _WS + rb"(?::" + _WS + rb'"?)?)?\Z')


class DeltaCounter:
    """Feed it every relayed buffer in order; ``tokens`` is the estimate so far (or the
    usage the upstream reported, when that is larger)."""

    __slots__ = ("_carry", "deltas", "usage")

    def __init__(self) -> None:
        self.deltas = 0  # non-empty generated strings seen
        self.usage = UsageScanner()
        self._carry: bytes | None = None

    @property
    def tokens(self) -> int:
        reported = self.usage.tokens
        if reported is not None and reported > self.deltas:
            return reported
        return self.deltas

    @property
    def estimated(self) -> bool:
        """Whether ``tokens`` is the estimate (no usage, or a smaller one, reported)."""
        reported = self.usage.tokens
        return self.deltas > 0 and (reported is None or reported < self.deltas)

    def feed(self, buf: Buffer) -> None:
        self.usage.feed(buf)
        pos = 0
        carry = self._carry
        if carry is not None:  # a key the previous buffer began
            self._carry = None
            joined = carry + bytes(buf[:DELTA_MAX_BYTES])
            metrics.count_copy("relay_deltas", len(joined))
            m = _DELTA.match(joined)
            if m is not None:
                self.deltas += 1
                pos = m.end() - len(carry)
            elif len(buf) <= DELTA_MAX_BYTES and _PARTIAL.match(joined) is not None:
                self._carry = joined  # still cut (a short read): carry on
                return
        end = pos
        for m in _DELTA.finditer(buf, pos):
            self.deltas += 1
            end = m.end()
        n = len(buf)
        if n and buf[-1] != _LF:  # a read that ends an event (or a line) cuts no key
            tail = _PARTIAL.search(buf, max(end, n - DELTA_MAX_BYTES))
            if tail is not None:
                self._carry = bytes(buf[tail.start() :])
