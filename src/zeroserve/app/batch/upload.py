"""The upload of a file (``POST /v1/files``): ``multipart/form-data`` as the openai SDK
sends it.

The body is written to disk as it arrives (:class:`UploadFile`, the request's body
store: each window the server receives it through is written from that window), so an
upload is never whole in memory. The handler then maps the stored form, finds its parts
with ``re`` (which reads the mapping in place), checks the file part is a batch input
(JSONL, within the limits on lines and line length) and writes it to its own file from
the mapping: no copy in user space anywhere.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

import msgspec

from ...errors import RequestError

# The parts of a form a file upload has, and how long a part's head may be (bytes: a
# name, a file name and a content type fit many times over).
MAX_PART_HEAD = 8 * 1024
MAX_PARTS = 8
_BOUNDARY = re.compile(rb'boundary="?([^";]+)"?', re.IGNORECASE)
_NAME = re.compile(rb'\bname="([^"]*)"', re.IGNORECASE)
_FILENAME = re.compile(rb'\bfilename="([^"]*)"', re.IGNORECASE)
_NEWLINE = re.compile(rb"\n")
_BLANK = re.compile(rb"\s*")
_raw = msgspec.json.Decoder(msgspec.Raw)


@dataclass(frozen=True, slots=True)
class Part:
    name: str
    filename: str | None
    start: int  # the part's content in the body: body[start:end]
    end: int


def boundary(content_type: bytes | None) -> bytes:
    """The multipart boundary of a ``multipart/form-data`` content type; else a 400."""
    if content_type is None or not content_type.lower().startswith(b"multipart/form-data"):
        raise RequestError(
            "a file is uploaded as multipart/form-data (fields: purpose, file)",
            param="file",
        )
    m = _BOUNDARY.search(content_type)
    if m is None or not 1 <= len(m.group(1)) <= 70:
        raise RequestError("the multipart content type has no valid boundary", param="file")
    return m.group(1)


def parts(body: memoryview, mark: bytes) -> dict[str, Part]:
    """The parts of a form body, by name, as spans of ``body`` (searched with ``re``,
    which reads the view in place)."""
    delimiter = re.compile(rb"(?:^|\r\n)--" + re.escape(mark) + rb"(--)?\r\n?")
    found: dict[str, Part] = {}
    m = delimiter.search(body)
    while m is not None and m.group(1) is None:
        head_end = bytes(body[m.end() : m.end() + MAX_PART_HEAD]).find(b"\r\n\r\n")
        if head_end < 0:
            raise RequestError("a multipart part's head is malformed or too long", param="file")
        head = bytes(body[m.end() : m.end() + head_end])
        start = m.end() + head_end + 4
        nxt = delimiter.search(body, start)
        if nxt is None:
            raise RequestError("the multipart body is not terminated", param="file")
        name = _NAME.search(head)
        if name is None:
            raise RequestError("a multipart part has no name", param="file")
        filename = _FILENAME.search(head)
        key = name.group(1).decode("utf-8", "replace")
        found[key] = Part(
            key,
            None if filename is None else filename.group(1).decode("utf-8", "replace"),
            start,
            nxt.start(),
        )
        if len(found) > MAX_PARTS:
            raise RequestError("too many parts in the form", param="file")
        m = nxt
    if m is None:
        raise RequestError("the multipart body is not terminated", param="file")
    return found


def count_lines(data: memoryview, max_line_bytes: int, max_lines: int) -> int:
    """The requests in a JSONL file: its non-blank lines, each one JSON value. A line that
    is not JSON (the file is not JSONL), longer than ``max_line_bytes``, or past
    ``max_lines`` is a 400 naming its line number (never its text). What a line asks is
    checked when its batch is validated: a bad request fails that line, not the file."""
    n = 0
    start = 0
    number = 0
    size = len(data)
    while start < size:
        m = _NEWLINE.search(data, start)
        end = size if m is None else m.start()
        number += 1
        line = data[start:end]
        start = end + 1
        if len(line) > max_line_bytes:
            raise RequestError(f"line {number} is longer than {max_line_bytes} bytes", param="file")
        if _BLANK.fullmatch(line):
            continue
        try:
            _raw.decode(line)
        except msgspec.DecodeError:
            raise RequestError(
                f"the file is not JSONL: line {number} is not a JSON value", param="file"
            ) from None
        n += 1
        if n > max_lines:
            raise RequestError(f"the file has more than {max_lines} requests", param="file")
    if n == 0:
        raise RequestError("the file has no requests", param="file")
    return n


class UploadFile:
    """A request body written to ``path`` as it arrives (a ``BodyStore``), up to
    ``limit`` bytes (a chunked body's size is known only as it arrives). A failed write
    (the disk full) is kept in ``error``, a body past the limit in ``too_large``, and the
    rest dropped: the I/O layer calls ``write`` and must not fail; the handler answers."""

    __slots__ = ("error", "fd", "limit", "path", "size", "too_large")

    def __init__(self, path: Path, limit: int) -> None:
        self.path = path
        self.limit = limit
        self.fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        self.size = 0
        self.error: OSError | None = None
        self.too_large = False

    def write(self, data: memoryview) -> None:
        if self.error is not None or self.too_large or self.fd < 0:
            return
        if self.size + len(data) > self.limit:
            self.too_large = True
            return
        try:
            done = 0
            while done < len(data):
                done += os.write(self.fd, data[done:])
            self.size += done
        except OSError as exc:
            self.error = exc

    def finish(self) -> None:
        """The body is whole: close the file (it is read back, then removed)."""
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def discard(self) -> None:
        self.finish()
        self.path.unlink(missing_ok=True)


def write(path: Path, data: memoryview) -> None:
    """Write ``data`` to ``path`` from the view and make it durable before it is named."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        done = 0
        while done < len(data):
            done += os.write(fd, data[done:])
        os.fsync(fd)
    finally:
        os.close(fd)
