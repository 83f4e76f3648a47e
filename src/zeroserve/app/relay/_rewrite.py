"""Rewriting the ``"model"`` field of a JSON request body without decoding the body.

Strategy
--------
A small scanner walks the top-level object only: keys are matched, values are skipped
with compiled regular expressions (strings in one ``re`` call each, however long, so a
64 KB prompt costs one C-level scan), nested objects and arrays by bracket depth. The
spans of top-level ``"model"`` string values are replaced by building a buffer list
``[prefix view, new value, suffix view]``: the body itself is never copied or parsed
into Python objects. Anything that is not a JSON object leaves the body untouched (the
upstream answers it with its own 400).
"""

from __future__ import annotations

import re

import msgspec

Buffer = bytes | bytearray | memoryview

_WS = re.compile(rb"[ \t\r\n]*")
# A JSON string, "unrolled loop" form: linear, no backtracking on long strings.
_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"', re.S)
_SCALAR = re.compile(rb"[^,}\]\s]+")  # number, true, false, null (checked upstream)
_STRUCT = re.compile(rb'["\[\]{}]')
_OPEN = frozenset(b"[{")
_QUOTE = 0x22


def model_spans(body: Buffer) -> list[tuple[int, int]] | None:
    """Spans of the top-level ``"model"`` string values, or None if ``body`` is not a
    JSON object the scanner can walk."""
    return value_spans(body, "model", strings=True)


def value_spans(body: Buffer, name: str, *, strings: bool = False) -> list[tuple[int, int]] | None:
    """Spans of the values of the top-level key ``name`` (only string values with
    ``strings``), or None if ``body`` is not a JSON object the scanner can walk."""
    plain = msgspec.json.encode(name)
    n = len(body)
    i = _WS.match(body, 0).end()  # type: ignore[union-attr]
    if i >= n or body[i] != 0x7B:  # {
        return None
    i = _WS.match(body, i + 1).end()  # type: ignore[union-attr]
    spans: list[tuple[int, int]] = []
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
        if (key == plain or (b"\\" in key and _decode(key) == name)) and (
            not strings or body[start] == _QUOTE
        ):
            spans.append((start, i))
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


def _skip_value(body: Buffer, i: int, n: int) -> int:
    if i >= n:
        return -1
    c = body[i]
    if c == _QUOTE:
        m = _STRING.match(body, i)
        return -1 if m is None else m.end()
    if c in _OPEN:
        depth = 0
        while True:
            m = _STRUCT.search(body, i)
            if m is None:
                return -1
            ch = body[m.start()]
            if ch == _QUOTE:
                s = _STRING.match(body, m.start())
                if s is None:
                    return -1
                i = s.end()
                continue
            i = m.end()
            depth += 1 if ch in _OPEN else -1
            if depth == 0:
                return i
    m = _SCALAR.match(body, i)
    return -1 if m is None else m.end()


def _decode(token: bytes) -> str | None:
    try:
        value = msgspec.json.decode(token)
    except msgspec.DecodeError:
        return None
    return value if isinstance(value, str) else None


def rewrite_model(body: memoryview, model: str) -> list[Buffer] | None:
    """``body`` as a buffer list with every top-level ``"model"`` string set to ``model``,
    or None when the body has no such field (send it as it is)."""
    spans = model_spans(body)
    if not spans:
        return None
    value = msgspec.json.encode(model)
    out: list[Buffer] = []
    pos = 0
    for start, end in spans:
        out += (body[pos:start], value)
        pos = end
    if pos < len(body):
        out.append(body[pos:])
    return out
