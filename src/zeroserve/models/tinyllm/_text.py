"""From token ids to text pieces: byte-level BPE bytes, UTF-8 safety and stop strings.

Strategy: each token id maps to the raw bytes it stands for (byte-level BPE spells bytes
with printable stand-in characters; ``token_bytes`` undoes that once, at load). A
``TextStream`` takes one token's bytes at a time and returns the text that is now safe to
emit:

* an incremental UTF-8 decoder holds back the bytes of a character split across tokens,
  so only complete characters are emitted (invalid bytes become U+FFFD);
* while stop strings are set, the longest tail of the text that could still grow into a
  stop string is held back; when a stop string appears, the text before it is released
  and the stream reports that it stopped. The stop string itself is never emitted, even
  when it spans several tokens.

Invariant: the concatenation of the pieces a stream returns is the decoded text cut
before the first stop string, whatever the token boundaries.
"""

from __future__ import annotations

import codecs
from collections.abc import Iterable, Mapping


def _byte_alphabet() -> dict[str, int]:
    """GPT-2's byte-to-printable-character table, inverted (the ByteLevel pre-tokenizer's)."""
    keep = [
        *range(ord("!"), ord("~") + 1),
        *range(ord("¡"), ord("¬") + 1),
        *range(ord("®"), ord("ÿ") + 1),
    ]
    chars = list(keep)
    extra = 0
    for b in range(256):
        if b not in keep:
            keep.append(b)
            chars.append(256 + extra)
            extra += 1
    return {chr(c): b for b, c in zip(keep, chars, strict=True)}


def token_bytes(vocab: Mapping[str, int], special: Iterable[str]) -> list[bytes]:
    """Bytes of every token id. Special tokens map to their literal UTF-8 spelling."""
    table = _byte_alphabet()
    specials = set(special)
    out = [b""] * (max(vocab.values()) + 1)
    for tok, i in vocab.items():
        if tok in specials:
            out[i] = tok.encode()
        else:
            out[i] = bytes(table[c] for c in tok)
    return out


class TextStream:
    """Turns token bytes into safe text pieces, honouring stop strings."""

    __slots__ = ("_decoder", "_held", "_max_stop", "_stops", "stopped")

    def __init__(self, stops: Iterable[str] = ()) -> None:
        self._decoder = codecs.getincrementaldecoder("utf-8")("replace")
        self._stops = [s for s in stops if s]
        self._max_stop = max((len(s) for s in self._stops), default=0)
        self._held = ""
        self.stopped = False

    def push(self, data: bytes) -> str:
        """Add one token's bytes; return the text that may be emitted now (maybe "")."""
        if self.stopped:
            return ""
        text = self._decoder.decode(data)
        if not self._stops:
            return text
        buf = self._held + text
        first = -1
        for s in self._stops:
            i = buf.find(s)
            if i != -1 and (first == -1 or i < first):
                first = i
        if first != -1:
            self.stopped = True
            self._held = ""
            return buf[:first]
        keep = self._partial_stop_tail(buf)
        self._held = buf[len(buf) - keep :]
        return buf[: len(buf) - keep]

    def flush(self) -> str:
        """At the end of generation: the held-back text (no stop string completed).

        Bytes of an unfinished UTF-8 character are dropped, never emitted half-way.
        """
        if self.stopped:
            return ""
        out, self._held = self._held, ""
        return out

    def _partial_stop_tail(self, buf: str) -> int:
        """Length of the longest suffix of ``buf`` that is a proper prefix of a stop."""
        for n in range(min(len(buf), self._max_stop - 1), 0, -1):
            tail = buf[len(buf) - n :]
            if any(s.startswith(tail) for s in self._stops):
                return n
        return 0
