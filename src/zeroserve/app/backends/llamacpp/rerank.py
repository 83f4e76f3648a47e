"""``/v1/rerank`` on a llama.cpp reranker (a GGUF started with ``embedding=true`` and
``pooling=rank``), in bounded chunks.

Strategy (docs/architecture.md, "The llama.cpp backend")
--------------------------------------------------------
``xllamacpp.Server.handle_rerank`` scores every document of its body in one call that
nothing can stop, as embeddings are; so the documents go in calls of at most
:data:`~.embeddings.EMBED_CHUNK_INPUTS` each, the query with every chunk, one after another
in one slot (``SlotPool.run``): a client that leaves or a deadline that passes stops the
request between two calls. Each call's scores come back by the index of its documents
(the engine sorts them); :func:`scores` puts them in the documents' order.
"""

from __future__ import annotations

import msgspec
from msgspec import Struct

from ..base import Relevance
from .embeddings import EMBED_CHUNK_INPUTS


class EngineScore(Struct, kw_only=True):
    index: int
    relevance_score: float


class EngineRerankUsage(Struct, kw_only=True, frozen=True):
    prompt_tokens: int = 0


class EngineRerank(Struct, kw_only=True):
    """What zeroserve reads of the engine's rerank answer."""

    results: list[EngineScore] = []
    usage: EngineRerankUsage = EngineRerankUsage()


_decoder = msgspec.json.Decoder(EngineRerank)


def chunks(query: str, documents: list[str]) -> list[tuple[int, bytes]]:
    """The engine calls of a rerank: (documents in it, its body), in order."""
    out: list[tuple[int, bytes]] = []
    for start in range(0, len(documents), EMBED_CHUNK_INPUTS):
        part = documents[start : start + EMBED_CHUNK_INPUTS]
        out.append((len(part), msgspec.json.encode({"query": query, "documents": part})))
    return out


def scores(answers: list[bytes], sizes: list[int]) -> Relevance:
    """The scores of every call's answer, in the documents' order, and the tokens read."""
    out: list[float] = []
    tokens = 0
    for answer, size in zip(answers, sizes, strict=True):
        decoded = _decoder.decode(answer)
        part = [0.0] * size
        seen = 0
        for r in decoded.results:
            if 0 <= r.index < size:
                part[r.index] = r.relevance_score
                seen += 1
        if seen != size:
            raise ValueError(f"the engine scored {seen} of {size} documents")
        out += part
        tokens += decoded.usage.prompt_tokens
    return Relevance(out, tokens)
