"""``zeroserve bench``: the DESIGN.md §7 benchmarks, zeroserve against its peers.

The harness drives every server as a subprocess over 127.0.0.1 and imports nothing else
from zeroserve. Run it as ``zeroserve bench`` or ``python -m zeroserve.bench``.
"""

from __future__ import annotations

from .cli import main

__all__ = ["main"]
