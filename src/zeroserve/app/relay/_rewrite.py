"""Rewriting the ``"model"`` field of a JSON request body without decoding the body.

Strategy
--------
A small scanner walks the top-level object only: keys are matched, values are skipped
with compiled regular expressions, nested objects and arrays by bracket depth. A string
value is skipped by searching for its next ``"`` (a literal search, which ``re`` runs at
memchr-like speed: ~23 us for a 64 KB prompt, where the ``[^"\\]*`` of a string regex
takes ~20 times longer); only when that quote follows a backslash is the whole string
matched by the regex (linear, in C: never worse than the regex alone). The
spans of top-level ``"model"`` string values are replaced by building a buffer list
``[prefix view, new value, suffix view]``: the body itself is never copied or parsed
into Python objects. Anything that is not a JSON object leaves the body untouched (the
upstream answers it with its own 400).

The same splice asks a streamed chat or completion for its usage when the edge counts
tokens (docs/architecture.md, "The edge"): :func:`rewrite_body` finds ``"stream"`` and
``"stream_options"`` in the same one pass and, for ``"stream": true`` without
``stream_options.include_usage`` true, adds ``"stream_options":{"include_usage":true}``
after the ``{``, or re-encodes the client's (small) ``stream_options`` object with
``include_usage`` set, keeping its other members' bytes as they were (``msgspec.Raw``).
That re-encoded object is the only copy of the client's bytes (site
``relay_stream_options``); the body around it is still the client's views. The body
without that edit (``Rewritten.unasked``: the client's body, or only its ``"model"``
rewritten) comes with it, for an upstream that refuses ``stream_options``
(docs/architecture.md, "The edge").
"""

from __future__ import annotations

import functools
import re
from typing import NamedTuple

import msgspec

from ... import metrics

Buffer = bytes | bytearray | memoryview

_WS = re.compile(rb"[ \t\r\n]*")
# A JSON string, "unrolled loop" form: linear, no backtracking on long strings.
_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"', re.S)
_SCALAR = re.compile(rb"[^,}\]\s]+")  # number, true, false, null (checked upstream)
_STRUCT = re.compile(rb'["\[\]{}]')
_OPEN = frozenset(b"[{")
_QUOTE = 0x22
_BACKSLASH = 0x5C
_QUOTE_SEARCH = re.compile(rb'"')


def model_spans(body: Buffer) -> list[tuple[int, int]] | None:
    """Spans of the top-level ``"model"`` string values, or None if ``body`` is not a
    JSON object the scanner can walk."""
    return value_spans(body, "model", strings=True)


def value_spans(body: Buffer, name: str, *, strings: bool = False) -> list[tuple[int, int]] | None:
    """Spans of the values of the top-level key ``name`` (only string values with
    ``strings``), or None if ``body`` is not a JSON object the scanner can walk."""
    found = top_level_spans(body, (name,))
    if found is None:
        return None
    spans = found[name]
    if strings:
        return [(a, b) for a, b in spans if body[a] == _QUOTE]
    return spans


def top_level_spans(
    body: Buffer, names: tuple[str, ...]
) -> dict[str, list[tuple[int, int]]] | None:
    """Spans of the values of each top-level key in ``names`` (in one pass), or None if
    ``body`` is not a JSON object the scanner can walk."""
    plain = _keys(names)
    spans: dict[str, list[tuple[int, int]]] = {name: [] for name in names}
    n = len(body)
    i = _WS.match(body, 0).end()  # type: ignore[union-attr]
    if i >= n or body[i] != 0x7B:  # {
        return None
    i = _WS.match(body, i + 1).end()  # type: ignore[union-attr]
    if i < n and body[i] == 0x7D:  # }
        return spans
    while True:
        m = _STRING.match(body, i)
        if m is None:
            return None
        key = m.group()
        i = _WS.match(body, m.end()).end()  # type: ignore[union-attr]
        if i >= n or body[i] != 0x3A:  # :
            return None
        i = _WS.match(body, i + 1).end()  # type: ignore[union-attr]
        start = i
        i = _skip_value(body, i, n)
        if i < 0:
            return None
        name = plain.get(key)
        if name is None and b"\\" in key:
            decoded = _decode(key)
            name = decoded if decoded in spans else None
        if name is not None:
            spans[name].append((start, i))
        i = _WS.match(body, i).end()  # type: ignore[union-attr]
        if i >= n:
            return None
        c = body[i]
        if c == 0x2C:  # ,
            i = _WS.match(body, i + 1).end()  # type: ignore[union-attr]
        elif c == 0x7D:
            return spans
        else:
            return None


@functools.lru_cache(maxsize=32)  # the callers' constant key tuples
def _keys(names: tuple[str, ...]) -> dict[bytes, str]:
    return {msgspec.json.encode(name): name for name in names}


def _skip_value(body: Buffer, i: int, n: int) -> int:
    if i >= n:
        return -1
    c = body[i]
    if c == _QUOTE:
        return _string_end(body, i)
    if c in _OPEN:
        depth = 0
        while True:
            m = _STRUCT.search(body, i)
            if m is None:
                return -1
            ch = body[m.start()]
            if ch == _QUOTE:
                i = _string_end(body, m.start())
                if i < 0:
                    return -1
                continue
            i = m.end()
            depth += 1 if ch in _OPEN else -1
            if depth == 0:
                return i
    m = _SCALAR.match(body, i)
    return -1 if m is None else m.end()


def _string_end(body: Buffer, i: int) -> int:
    """The end of the JSON string that begins at ``body[i]`` (a ``"``), or -1."""
    m = _QUOTE_SEARCH.search(body, i + 1)
    if m is None:
        return -1
    q = m.start()
    if body[q - 1] != _BACKSLASH:
        return q + 1  # the common case: no escaped quote before the end
    s = _STRING.match(body, i)  # escapes: the regex, linear and in C as well
    return -1 if s is None else s.end()


def _decode(token: bytes) -> str | None:
    try:
        value = msgspec.json.decode(token)
    except msgspec.DecodeError:
        return None
    return value if isinstance(value, str) else None


def rewrite_model(body: memoryview, model: str) -> list[Buffer] | None:
    """``body`` as a buffer list with every top-level ``"model"`` string set to ``model``,
    or None when the body has no such field (send it as it is)."""
    return rewrite_body(body, model=model, ask_usage=False).body


def splice(body: memoryview, edits: list[tuple[int, int, bytes]]) -> list[Buffer]:
    """``body`` as a buffer list with each ``(start, end, value)`` span replaced (an
    empty span inserts): views of ``body`` around the new values."""
    out: list[Buffer] = []
    pos = 0
    for start, end, value in sorted(edits, key=lambda e: (e[0], e[1])):
        if start > pos:
            out.append(body[pos:start])
        out.append(value)
        pos = end
    if pos < len(body):
        out.append(body[pos:])
    return out


class Rewritten(NamedTuple):
    """What :func:`rewrite_body` made of a request body."""

    body: list[Buffer] | None  # None: send the client's body as it is
    asked_usage: bool  # ``include_usage`` set on the client's behalf
    # With ``asked_usage``: the body without that edit (None: the client's body as it
    # is), for an upstream that refuses ``stream_options``. Views, no copy.
    unasked: list[Buffer] | None = None
    # With ``asked_usage``: the client sent a ``stream_options`` of its own (re-encoded),
    # so an upstream's error that names it may be about the client's members.
    own_options: bool = False


_UNCHANGED = Rewritten(None, False)
_ASK_USAGE = b'"stream_options":{"include_usage":true},'
_INCLUDE_USAGE = b'{"include_usage":true}'
_TRUE = msgspec.Raw(b"true")
_decode_any = msgspec.json.Decoder().decode
_decode_options = msgspec.json.Decoder(dict[str, msgspec.Raw] | None).decode


def rewrite_body(body: memoryview, *, model: str | None, ask_usage: bool) -> Rewritten:
    """``body`` with every top-level ``"model"`` string set to ``model`` (if given) and,
    with ``ask_usage``, a stream that did not ask for its usage asking for it."""
    names: tuple[str, ...] = ("model",) if model is not None else ()
    if ask_usage:
        names += ("stream", "stream_options")
    if not names:
        return _UNCHANGED
    spans = top_level_spans(body, names)
    if spans is None:
        return _UNCHANGED
    edits: list[tuple[int, int, bytes]] = []
    if model is not None:
        value = msgspec.json.encode(model)
        edits += [(a, b, value) for a, b in spans["model"] if body[a] == _QUOTE]
    usage = _usage_edits(body, spans["stream"], spans["stream_options"]) if ask_usage else None
    if usage:
        unasked = splice(body, edits) if edits else None
        own = bool(spans["stream_options"])
        return Rewritten(splice(body, edits + usage), True, unasked, own)
    if not edits:
        return _UNCHANGED
    return Rewritten(splice(body, edits), False)


def _usage_edits(
    body: memoryview, stream: list[tuple[int, int]], options: list[tuple[int, int]]
) -> list[tuple[int, int, bytes]] | None:
    """The edits that make a ``"stream": true`` body ask for its usage; None when it is
    not a stream, already asks, or has a ``stream_options`` the upstream must judge."""
    if not stream:
        return None
    a, b = stream[-1]  # JSON decoders keep the last of repeated keys
    try:
        if _decode_any(body[a:b]) is not True:
            return None
    except msgspec.DecodeError:
        return None
    if not options:
        head = _WS.match(body, 0).end() + 1  # type: ignore[union-attr]
        return [(head, head, _ASK_USAGE)]
    a, b = options[-1]
    try:
        opts = _decode_options(body[a:b])
        flag = None if opts is None or "include_usage" not in opts else opts["include_usage"]
        current = None if flag is None else _decode_any(flag)
    except (msgspec.DecodeError, msgspec.ValidationError):
        return None  # not an object: the upstream answers it with its own 400
    if current is True or (current is not None and current is not False):
        return None  # asked already, or a value the upstream must judge
    if opts is None:
        new = _INCLUDE_USAGE
    else:
        opts["include_usage"] = _TRUE
        new = msgspec.json.encode(opts)
        metrics.count_copy("relay_stream_options", len(new))
    return [(a, b, new) for a, b in options]
