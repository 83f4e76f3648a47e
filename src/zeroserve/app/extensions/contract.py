"""What ``/openapi.json`` says of the extensions' routes beyond their Structs' schemas
(``app/apidoc.py``): the only values served, the configurable limits and the rules
between fields, each checked where the request is decoded (``routes.py``)."""

from __future__ import annotations

from typing import Any

from ..apidoc import Refinement
from . import schemas as x


def _only(values: list[Any], why: str) -> dict[str, Any]:
    return {"enum": values, "description": f"Only these values are served: {why}."}


TOKENIZE = (
    Refinement(
        x.TokenizeRequest,
        limits={"messages": ("maxItems", "messages")},
        only={
            "add_generation_prompt": _only([True, None], "the chat templates here open it"),
            "return_token_strs": _only([False, None], "token strings are not served"),
            "with_pieces": _only([False, None], "token pieces are not served"),
        },
        rules=(
            {  # exactly one input
                "oneOf": [
                    {"required": ["prompt"]},
                    {"required": ["content"]},
                    {"required": ["messages"]},
                ]
            },
            {"not": {"required": ["add_special_tokens", "add_special"]}},  # one spelling
        ),
    ),
)

DETOKENIZE = (Refinement(x.DetokenizeRequest),)

RERANK = (Refinement(x.RerankRequest, limits={"documents": ("maxItems", "embedding_inputs")}),)
