"""The wire shapes of ``/tokenize``, ``/detokenize`` and ``/v1/rerank``, as vLLM and
llama.cpp's server take them (docs/extensions.md), decoded once with msgspec.

Unknown fields are refused by name, as on every route here. A field two servers spell
differently is taken in both spellings (``prompt`` or llama.cpp's ``content``;
``add_special_tokens`` or ``add_special``), one at a time.
"""

from __future__ import annotations

from typing import Annotated

import msgspec
from msgspec import UNSET, Meta, Struct, UnsetType

from ..openai.schemas import Message, PriorityClass

# Largest text tokenized at once, in UTF-8 bytes: its tokens (at most one a byte, plus
# specials) must fit the engine's bounded answer (``models/llamacpp_side.py``).
MAX_TOKENIZE_BYTES = 512 * 1024
_SIZE = f"At most {MAX_TOKENIZE_BYTES} bytes of UTF-8 (messages: their texts in all)."
# Most tokens detokenized at once (a whole long context).
MAX_DETOKENIZE_TOKENS = 1 << 16
# A token id: any vocabulary is far smaller (the model says which ids it has).
TokenId = Annotated[int, Meta(ge=0, le=(1 << 31) - 1)]


class TokenizeRequest(Struct, kw_only=True, forbid_unknown_fields=True):
    """Exactly one of ``prompt``, ``content`` (llama.cpp's name for it) and ``messages``
    (tokenized as the model reads them: its chat template applied, the answer's turn
    opened). ``add_special_tokens`` (or llama.cpp's ``add_special``): with the special
    tokens the model puts around a text (a beginning-of-sequence); by default with them
    for a prompt and without them for messages, whose template writes its own, as vLLM
    does. ``tools`` and ``tool_choice`` (with ``messages`` only, in chat's shape): counted
    as a chat with them would be read, the tools' prompt included."""

    model: str
    prompt: Annotated[str, Meta(description=_SIZE)] | UnsetType = UNSET
    content: Annotated[str, Meta(description=_SIZE)] | UnsetType = UNSET
    messages: Annotated[list[Message], Meta(min_length=1)] | UnsetType = UNSET
    tools: msgspec.Raw | UnsetType = UNSET
    tool_choice: msgspec.Raw | UnsetType = UNSET
    add_special_tokens: bool | UnsetType = UNSET
    add_special: bool | UnsetType = UNSET
    add_generation_prompt: bool | None = None  # only true: the templates here open it
    return_token_strs: bool | None = None  # only false
    with_pieces: bool | None = None  # only false (llama.cpp's)


class TokenizeResponse(Struct):
    """``count`` tokens, their ids, and the model's context (``max_model_len``; null
    when the model has none). ``token_strs`` is always null (vLLM's field, not asked)."""

    count: int
    max_model_len: int | None
    tokens: list[int]
    token_strs: None = None


class DetokenizeRequest(Struct, kw_only=True, forbid_unknown_fields=True):
    model: str
    tokens: Annotated[list[TokenId], Meta(max_length=MAX_DETOKENIZE_TOKENS)]


class DetokenizeResponse(Struct):
    """The text, as vLLM names it (``prompt``) and as llama.cpp does (``content``)."""

    prompt: str
    content: str


class RerankDocument(Struct, kw_only=True, forbid_unknown_fields=True):
    text: str


class RerankRequest(Struct, kw_only=True, forbid_unknown_fields=True):
    """``documents`` scored against ``query``: strings or ``{"text"}`` objects (Jina's and
    Cohere's). ``top_n``: the best n only (0 or absent: every one); ``return_documents``
    (default true): each result carries its document's text. ``priority``: the
    request's class (vLLM's field), as on chat and embeddings."""

    model: str
    query: str
    documents: Annotated[list[str | RerankDocument], Meta(min_length=1)]
    top_n: Annotated[int, Meta(ge=0)] | None = None
    return_documents: bool | None = None
    priority: PriorityClass | None = None


class RerankResult(Struct, omit_defaults=True):
    index: int
    relevance_score: float
    document: RerankDocument | UnsetType = UNSET


class RerankUsage(Struct):
    prompt_tokens: int
    total_tokens: int


class RerankResponse(Struct):
    """``results`` best first; ``usage``: the tokens read (query and documents)."""

    id: str
    object: str
    model: str
    results: list[RerankResult]
    usage: RerankUsage
