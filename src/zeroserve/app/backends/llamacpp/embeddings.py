"""``/v1/embeddings`` on a llama.cpp model, in bounded chunks.

Strategy (docs/architecture.md, "The llama.cpp backend")
--------------------------------------------------------
``xllamacpp.Server.handle_embeddings`` takes the whole body and returns the whole answer;
it has no callback, so nothing can stop it once it runs. A request of many inputs is
therefore split here into engine calls of at most :data:`EMBED_CHUNK_INPUTS` inputs each
(:func:`chunks`), run one after another: a client that leaves or a deadline that passes
stops the request between two calls, so the engine is free again within one chunk
(``SlotPool.run``). The answer of one chunk is OpenAI's and is sent as it is; the
answers of several chunks are merged here (:func:`merge`): the items in order, their
``index`` renumbered, the ``usage`` summed. The vectors are not decoded (``msgspec.Raw``),
floats and base64 alike.
"""

from __future__ import annotations

import msgspec
from msgspec import UNSET, Struct, UnsetType

from ...openai import schemas as s

# Most inputs of one engine embedding call: the bound on the work a client that left, or
# a deadline that passed, can still cost the engine (the call cannot be stopped). Each
# input is one sequence of at most the model's context; 8 short inputs are a fraction of
# a second for a small model on two cores, and a chunk of 8 still fills the engine's
# slots (``parallel``, 1 to 4 in the built-in examples) at every call.
EMBED_CHUNK_INPUTS = 8

_encode = msgspec.json.encode


class EmbeddingItem(Struct, kw_only=True, omit_defaults=True):
    """One vector of the engine's answer, kept as it came but for its ``index``."""

    embedding: msgspec.Raw
    index: int
    object: str = "embedding"
    encoding_format: str | UnsetType = UNSET


class MergedUsage(Struct, kw_only=True):
    prompt_tokens: int = 0
    total_tokens: int = 0


class EmbeddingAnswer(Struct, kw_only=True):
    """The engine's embeddings answer, in its own field order."""

    model: str
    object: str = "list"
    usage: MergedUsage
    data: list[EmbeddingItem]


answer_decoder = msgspec.json.Decoder(EmbeddingAnswer)


def chunks(body: s.EmbeddingRequest, alias: str) -> list[tuple[int, bytes]]:
    """The engine bodies of ``body``, each with its count of inputs: one for one input
    (a string, one token list) or a list of at most :data:`EMBED_CHUNK_INPUTS`, else
    chunks of that many."""
    inputs = body.input
    if isinstance(inputs, str) or any(isinstance(x, int) for x in inputs):
        # One input (a string, or one tokenised input, or a mix the engine judges).
        return [
            (1, _encode({"model": alias, "input": inputs, "encoding_format": body.encoding_format}))
        ]
    out = []
    for start in range(0, len(inputs), EMBED_CHUNK_INPUTS):
        part = inputs[start : start + EMBED_CHUNK_INPUTS]
        payload = {"model": alias, "input": part, "encoding_format": body.encoding_format}
        out.append((len(part), _encode(payload)))
    return out


def merge(answers: list[bytes]) -> bytes:
    """One answer from the answers of a request's chunks, in order."""
    merged: EmbeddingAnswer | None = None
    for raw in answers:
        answer = answer_decoder.decode(raw)
        if merged is None:
            merged = answer
            continue
        offset = len(merged.data)
        for item in answer.data:
            item.index += offset
        merged.data += answer.data
        merged.usage.prompt_tokens += answer.usage.prompt_tokens
        merged.usage.total_tokens += answer.usage.total_tokens
    assert merged is not None, "a request has at least one chunk"
    return _encode(merged)
