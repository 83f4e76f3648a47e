"""A request's own ``keep_alive`` (docs/models.md, "A request's keep_alive").

Ollama's field and meaning: how long the model stays loaded once idle after this request.
A number is seconds; a string is a number with a unit (``"300ms"``, ``"30s"``, ``"5m"``,
``"1h"``; no unit: seconds); ``0`` unloads the model as soon as it is idle; a negative
value keeps it loaded until unloaded by hand. The manager keeps, for each idle period, the
longest keep_alive the requests of the busy period before it asked
(``ModelManager.ask_keep_alive``).
"""

from __future__ import annotations

import math
import re
from typing import Annotated

from msgspec import Meta

_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "": 1.0}
PATTERN = r"^-?[0-9]+(\.[0-9]+)?(ms|s|m|h)?$"
_TEXT = re.compile(PATTERN)

KeepAliveText = Annotated[
    str,
    Meta(
        pattern=PATTERN,
        description="How long the model stays loaded once idle after this request "
        "(Ollama's keep_alive): a duration such as 30s, 5m or 1h, 0 to unload it when "
        "idle, negative to keep it loaded.",
    ),
]
KeepAliveSeconds = Annotated[
    float,
    Meta(
        description="How long the model stays loaded once idle after this request, in "
        "seconds (Ollama's keep_alive): 0 unloads it when idle, negative keeps it loaded.",
    ),
]
# The body field's type, on every route that names a model to generate or embed with.
KeepAlive = KeepAliveSeconds | KeepAliveText


def keep_alive_s(value: float | str | None) -> float | None:
    """Seconds from a body's ``keep_alive`` (``math.inf`` for a negative one); None when
    absent. A string is already checked against ``PATTERN`` by the schema."""
    if value is None:
        return None
    if isinstance(value, str):
        m = _TEXT.match(value)
        if m is None:  # the schema refuses it first
            raise ValueError(f"keep_alive {value!r} is not a duration")
        unit = m.group(2) or ""
        seconds = float(value[: len(value) - len(unit)]) * _UNITS[unit]
    else:
        seconds = float(value)
    if math.isnan(seconds):
        raise ValueError("keep_alive must be a number")
    return math.inf if seconds < 0 else seconds
