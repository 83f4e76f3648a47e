"""What a client is told of a failed load (docs/architecture.md, "Models at run time").

A load's reason comes from wherever the load failed: the GGUF check, the engine's
loader, a model's own ``load`` (``FileNotFoundError`` text), a worker's traceback line.
Many name a file by its absolute server path, which says how the server's disk is laid
out; a client needs the file, not the place. ``public_reason`` keeps the text and
shortens every absolute path in it to its last part (``/srv/models/bad.gguf`` becomes
``bad.gguf``); the server's log keeps the full reason (the manager logs it).

A path is a ``/`` that does not follow a word character, ``:``, ``/``, ``.``, ``~`` or
``-`` (so ``https://host/x``, ``1/2`` and ``a/b`` are left alone), then segments up to
a space, quote, bracket, ``:``, ``,`` or ``;``. A path with a space in it is shortened
up to the space.
"""

from __future__ import annotations

import re

_SEGMENT = r"[^\s'\"`:,;()\[\]{}<>/]+"
_PATH = re.compile(rf"(?<![\w:/.~-])/(?:{_SEGMENT}/)*({_SEGMENT})")


def public_reason(reason: str) -> str:
    """``reason`` with every absolute path shortened to its last part."""
    return _PATH.sub(lambda m: m.group(1), reason)
