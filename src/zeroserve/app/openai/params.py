"""Which OpenAI parameters the generic generation path (``Model.generate``: ``tinyllm``,
``echo``, the transformers backend, user models) honours, and the 400 for the others.

``Model.generate`` takes a prompt, ``max_tokens``, ``temperature``, ``top_p``, ``seed`` and
``stop``; the endpoint adds ``n`` and ``stream_options``. Every other OpenAI parameter
is accepted only at its neutral value (the one that changes nothing: ``0`` penalties, an
empty ``logit_bias``, no ``tools``, a ``text`` response format); any other value gets a
400 whose ``param`` names it. Engine-backed models honour the full surface instead
(``app/engine_relay.py``).
"""

from __future__ import annotations

from typing import Any

from ...errors import RequestError


def _neutral_choice(value: Any) -> bool:
    return value is None or value in ("none", "auto")


# parameter -> "is this value neutral?"
_CHAT_NEUTRAL: dict[str, Any] = {
    "logprobs": lambda v: not v,
    "top_logprobs": lambda v: not v,
    "presence_penalty": lambda v: not v,
    "frequency_penalty": lambda v: not v,
    "logit_bias": lambda v: not v,
    "response_format": lambda v: v is None or v.get("type") == "text",
    "tools": lambda v: not v,
    "tool_choice": _neutral_choice,
    "modalities": lambda v: v is None or list(v) == ["text"],
}
_COMPLETION_NEUTRAL: dict[str, Any] = {
    "presence_penalty": lambda v: not v,
    "frequency_penalty": lambda v: not v,
    "logit_bias": lambda v: not v,
}


def refuse_unsupported(body: Any, *, chat: bool) -> None:
    """Raise a 400 naming the first parameter set to a value this path cannot honour."""
    for name, neutral in (_CHAT_NEUTRAL if chat else _COMPLETION_NEUTRAL).items():
        if not neutral(getattr(body, name)):
            raise RequestError(f"'{name}' is not supported by this model", param=name)
