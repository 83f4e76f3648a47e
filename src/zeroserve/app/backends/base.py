"""The seam between the APIs and what serves a model (docs/architecture.md, "Adding a
backend").

A :class:`FrontEnd` is a chat-like API (chat completions, completions, the Responses
API): it decodes its own request shape into the one :class:`~..chat.ChatRequest` and
writes the answer's :class:`~..chat.Choices` back in its own shape. A :class:`Backend`
serves one model: the model's own ``generate`` (``local``), an in-process llama.cpp
engine (``llamacpp``), or an upstream server (``remote``). Every front end reaches
every backend through these two calls, so a new API is one front end and a new backend
is one module.
"""

from __future__ import annotations

from collections.abc import Awaitable
from dataclasses import dataclass, field
from typing import Literal, Protocol

from ...upstream import UpstreamStatistics
from ..chat import ChatRequest, Choices
from ..openai.schemas import EmbeddingRequest
from ..request import Request
from ..response import HandlerResult


class FrontEnd(Protocol):
    """A chat-like API."""

    @property
    def upstream_path(self) -> str:
        """Where an OpenAI-compatible upstream serves the same API (``/chat/completions``):
        a backend that relays requests undecoded sends them there."""
        ...

    def decode(self, req: Request) -> ChatRequest:
        """The request as the one chat request: checked (a 400 naming the field at
        fault), its counts within the API limits."""
        ...

    def respond(self, choices: Choices, chat: ChatRequest, req: Request) -> HandlerResult:
        """The answer in this API's shape: whole, or streamed when ``chat.stream``. It
        owns ``choices`` from now on (their tickets and outputs)."""
        ...


@dataclass(frozen=True, slots=True)
class Capabilities:
    """What a model's backend serves, as ``/v1/models`` tells a client before it sends:
    the chat-like APIs (``chat``) and embeddings; the optional chat parameters it honours
    (``honours``: names of ``app/chat/request.py``'s ``OPTIONAL_PARAMETERS``; the others
    are refused with a 400 naming them); its context (tokens, when known); the width of its embeddings, when fixed
    (``embedding_dimensions``: the only ``dimensions`` served); whether it embeds
    token arrays as well as text (``token_inputs``); what a chat may carry
    (``input_modalities``: ``text``, and ``image`` for a model that reads images); and
    whether an upstream decides all of it (``relayed``: what the upstream accepts is not
    known here). ``tokenizer``: ``/tokenize`` and ``/detokenize`` are served (relayed:
    by the upstream's own routes); ``rerank``:
    how ``/v1/rerank`` scores (``cross-encoder``: a reranker reads query and document
    together; ``bi-encoder``: the cosine of their embeddings), None when not served."""

    chat: bool
    embeddings: bool
    honours: frozenset[str] = frozenset()
    context_length: int | None = None
    relayed: bool = False
    embedding_dimensions: int | None = None
    token_inputs: bool = False
    input_modalities: tuple[str, ...] = ("text",)
    tokenizer: bool = False
    rerank: Literal["cross-encoder", "bi-encoder"] | None = None


@dataclass(frozen=True, slots=True)
class Relevance:
    """A rerank's scores: one per document, in the documents' order; ``tokens`` read."""

    scores: list[float]
    tokens: int


@dataclass(frozen=True, slots=True)
class BackendStatistics:
    """What a backend counts beyond the runtime's own statistics: a relay's upstreams
    (``"<model> <url>"``: their connections, requests, errors)."""

    upstreams: dict[str, UpstreamStatistics] = field(default_factory=dict)


class Backend(Protocol):
    """What serves one model's chat-like and embedding APIs."""

    @property
    def name(self) -> str:
        """The served model's name."""
        ...

    @property
    def forwards(self) -> bool:
        """Whether requests go to this backend undecoded (:meth:`forward`): a relay's
        upstream decides what its API accepts."""
        ...

    def forward(self, req: Request, path: str) -> HandlerResult:
        """Answer ``req`` (admitted by the caller) without decoding it: relay it to the
        same API's route, ``path`` (a front end's ``upstream_path``, ``/embeddings``, or
        ``"raw"`` for the raw API). Backends whose ``forwards`` is true."""
        ...

    def chat(self, api: FrontEnd, chat: ChatRequest, req: Request) -> HandlerResult:
        """Answer a chat request: refuse (400, naming it) what the model cannot honour,
        admit one ticket per choice (429 past the queue), and hand the choices to
        ``api.respond``."""
        ...

    def embeddings(self, body: EmbeddingRequest, req: Request) -> HandlerResult:
        """Answer an embeddings request (OpenAI's shape)."""
        ...

    async def prompt_tokens(self, chat: ChatRequest) -> int:
        """The tokens of ``chat``'s conversation as the model reads it (its chat
        template applied): a 400 naming what the model cannot take, as :meth:`chat`."""
        ...

    async def tokenize(
        self, text: str | None, chat: ChatRequest | None, add_special: bool
    ) -> list[int]:
        """The token ids of ``text``, or of ``chat``'s conversation as the model reads it
        (its chat template applied); ``add_special``: with the special tokens the model
        puts around a text. A 400 naming ``model`` where it has no tokenizer."""
        ...

    async def detokenize(self, tokens: list[int]) -> str:
        """The text of ``tokens``: a 400 naming ``tokens`` for an id outside the
        vocabulary, or ``model`` where the model has no tokenizer."""
        ...

    def rerank(self, query: str, documents: list[str], req: Request) -> Awaitable[Relevance]:
        """Score ``documents`` against ``query``: the ticket taken now (429 before any
        work), the work when awaited. A 400 naming ``model`` where it cannot rerank."""
        ...

    def capabilities(self) -> Capabilities:
        """What the model serves (``/v1/models``)."""
        ...

    def statistics(self) -> BackendStatistics: ...

    async def aclose(self) -> None:
        """Let go of what the backend holds (a relay's connections); the model stays."""
        ...
