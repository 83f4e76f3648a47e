"""Dropping the usage chunk a relayed stream's client did not ask for.

Strategy
--------
When the edge counts a relayed stream's tokens and the client did not ask for
``stream_options.include_usage``, the relay asks the upstream for it (``_rewrite.py``)
and the upstream answers with one more event before ``data: [DONE]``: a chunk whose
``"choices"`` is ``[]`` and whose ``"usage"`` is an object
(docs/decisions/0019-relay-counts-stream-tokens.md). The relay reads it
(``UsageScanner``, on the views as they came) and this filter takes that event out of
what the client gets, since SDK code indexes ``choices[0]``.

``UsageChunkFilter.feed`` splits the relayed views into server-sent events only as far
as it must, in place:

* in a view, a candidate is found with one regular expression (``"choices": []``); only
  the event around a candidate is decoded (msgspec) and dropped when it is exactly a
  usage chunk (every line ``data:``, ``choices`` empty, ``usage`` an object). Everything
  else goes out as slices of the original views, in order: zero copy;
* a view that ends inside an event leaves that partial event held back, as views (the
  upstream's reads are fresh ``bytes``, so holding a view copies nothing), until the
  event's end arrives; an event is judged only once it is whole. The held bytes are
  bounded by ``USAGE_EVENT_MAX_BYTES``: past that the event cannot be a usage chunk, so
  what is held goes out and the rest of that event passes through unlooked-at;
* an event held across views is joined (copied, at most ``USAGE_EVENT_MAX_BYTES``, site
  ``relay_events``) to be judged; events within one view never are (but a candidate's
  several ``data:`` lines, joined as SSE joins them, same site).

An event ends at a blank line (``\\n\\n``, or ``\\r\\n\\r\\n`` and its mixes); the last two
bytes seen are kept as integers, so an end cut by a read is found without a copy. A
chunk that carries usage *and* choices (a cumulative usage on every chunk) is left as
it is, as is anything the filter cannot judge: the client then gets what the upstream
sent. At the end of the body a held partial event goes out as it came.
"""

from __future__ import annotations

import re

import msgspec

from ... import metrics

# Longest event judged as a usage chunk. OpenAI's usage chunk, with its token details,
# id, model and fingerprint, is ~600 bytes; 8 KiB leaves room for long model names and
# extra fields while bounding what a split event holds back from the client.
USAGE_EVENT_MAX_BYTES = 8192

_LF = 0x0A
_CR = 0x0D
_OPEN_BRACE = 0x7B
# The end of an event: a line end, then an empty line (LF or CRLF endings).
_END = re.compile(rb"\n\r?\n")
_EMPTY_CHOICES = re.compile(rb'"choices"\s*:\s*\[\s*\]')
_USAGE_OBJECT = re.compile(rb'"usage"\s*:\s*\{')
_LINE_END = re.compile(rb"\r?\n")


_NULL = msgspec.Raw(b"null")


class _Chunk(msgspec.Struct):
    choices: list[msgspec.Raw] | None = None
    usage: msgspec.Raw = _NULL  # kept as its bytes (msgspec has no ``Raw | None``)


_decode_chunk = msgspec.json.Decoder(_Chunk).decode


def is_usage_chunk(event: bytes | memoryview) -> bool:
    """Whether ``event`` (one whole SSE event, its end included) is an OpenAI usage-only
    chunk: ``data:`` lines only, whose JSON has ``"choices": []`` and a ``usage`` object."""
    if _EMPTY_CHOICES.search(event) is None or _USAGE_OBJECT.search(event) is None:
        return False
    data: list[bytes | memoryview] = []
    pos = 0
    n = len(event)
    for m in _LINE_END.finditer(event):
        line = event[pos : m.start()]
        pos = m.end()
        if len(line):
            if bytes(line[:5]) != b"data:":
                return False  # an event name, id or comment: not OpenAI's chunk
            data.append(line[6:] if len(line) > 5 and line[5] == 0x20 else line[5:])
    if pos < n or not data:
        return False
    if len(data) == 1:
        payload = data[0]
    else:  # one event's data lines, joined as SSE joins them (rare: OpenAI sends one)
        payload = b"\n".join(data)
        metrics.count_copy("relay_events", len(payload))
    try:
        chunk = _decode_chunk(payload)
    except (msgspec.DecodeError, msgspec.ValidationError):
        return False
    return chunk.choices == [] and memoryview(chunk.usage)[0] == _OPEN_BRACE


class UsageChunkFilter:
    """Feed it every relayed view in order; it returns the views for the client, with
    the usage chunk taken out. ``flush()`` at the end returns what it still holds."""

    __slots__ = ("_held", "_held_bytes", "_last", "_passing", "_prev", "dropped")

    def __init__(self) -> None:
        self._held: list[memoryview] = []  # a partial event, from its first byte
        self._held_bytes = 0
        self._passing = False  # inside an event too long to judge: pass to its end
        self._last = -1  # the last byte seen, and the one before it (-1: none)
        self._prev = -1
        self.dropped = 0  # usage chunks taken out

    def feed(self, views: list[memoryview]) -> list[memoryview]:
        out: list[memoryview] = []
        for view in views:
            if len(view):
                self._feed(view, out)
                self._prev = view[-2] if len(view) > 1 else self._last
                self._last = view[-1]
        return out

    def flush(self) -> list[memoryview]:
        held, self._held = self._held, []
        self._held_bytes = 0
        return held

    def _first_end(self, view: memoryview) -> int:
        """The end of the first event end in ``view``, counting the bytes before it
        (an end cut by the read); -1 if there is none."""
        n = len(view)
        last = self._last
        if view[0] == _LF and (last == _LF or (last == _CR and self._prev == _LF)):
            return 1
        if n > 1 and view[1] == _LF and view[0] == _CR and last == _LF:
            return 2
        m = _END.search(view)
        return -1 if m is None else m.end()

    def _feed(self, view: memoryview, out: list[memoryview]) -> None:
        pos = 0
        if self._passing:
            end = self._first_end(view)
            if end < 0:
                out.append(view)
                return
            out.append(view[:end])
            self._passing = False
            pos = end
        elif self._held:
            end = self._first_end(view)
            held = self._held
            if end < 0:
                if self._held_bytes + len(view) > USAGE_EVENT_MAX_BYTES:
                    out += held
                    out.append(view)
                    self._passing = True
                    self.flush()
                else:
                    held.append(view)
                    self._held_bytes += len(view)
                return
            size = self._held_bytes + end
            event = [*held, view[:end]]
            self.flush()
            if size <= USAGE_EVENT_MAX_BYTES:
                joined = b"".join(event)
                metrics.count_copy("relay_events", size)
                if is_usage_chunk(joined):
                    self.dropped += 1
                    event = []
            out += event
            pos = end
        self._scan(view, pos, out)

    def _scan(self, view: memoryview, pos: int, out: list[memoryview]) -> None:
        """``view[pos:]``, which begins an event: its whole events out (but a usage
        chunk), its partial last one held (or passed, if too long to judge)."""
        n = len(view)
        while pos < n:
            m = _EMPTY_CHOICES.search(view, pos)
            if m is None:
                break
            e = _END.search(view, m.end())
            if e is None:
                break  # the candidate is in the partial last event
            start = self._event_start(view, pos, m.start())
            end = e.end()
            if (
                start >= 0
                and end - start <= USAGE_EVENT_MAX_BYTES
                and is_usage_chunk(view[start:end])
            ):
                self.dropped += 1
                if start > pos:
                    out.append(view[pos:start])
                pos = end
                continue
            out.append(view[pos:end])
            pos = end
        if pos >= n:
            return
        if _ends_event(view, pos, n):
            out.append(view[pos:] if pos else view)
            return
        lo = max(pos, n - USAGE_EVENT_MAX_BYTES)
        tail = pos if lo == pos else -1
        for e in _END.finditer(view, lo):
            tail = e.end()
        if tail < 0:  # the partial event is already too long to judge
            out.append(view[pos:] if pos else view)
            self._passing = True
            return
        if tail > pos:
            out.append(view[pos:tail])
        if tail < n:
            self._held = [view[tail:]]
            self._held_bytes = n - tail

    @staticmethod
    def _event_start(view: memoryview, pos: int, at: int) -> int:
        """Where the event holding ``view[at]`` begins (``pos`` begins one); -1 if it
        begins more than ``USAGE_EVENT_MAX_BYTES`` before ``at``."""
        lo = max(pos, at - USAGE_EVENT_MAX_BYTES)
        start = pos if lo == pos else -1
        for e in _END.finditer(view, lo, at):
            start = e.end()
        return start


def _ends_event(view: memoryview, pos: int, n: int) -> bool:
    """Whether ``view[pos:n]`` (at least one byte) ends with an event's end."""
    if n - pos < 2 or view[n - 1] != _LF:
        return False
    b = view[n - 2]
    return b == _LF or (b == _CR and n - pos >= 3 and view[n - 3] == _LF)
