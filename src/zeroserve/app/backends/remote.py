"""The ``remote`` backend: an OpenAI-compatible upstream (or several) that a request is
relayed to undecoded (docs/gateway.md), so parameters only the upstream understands pass
through untouched and the answer's bytes come back as the upstream wrote them.

The relay itself (balancing, fail-over, usage counting) is ``app/relay/``; this module
is its seat in the backend table.
"""

from __future__ import annotations

from collections.abc import Awaitable
from typing import Protocol, runtime_checkable

from ...models.remote import RemoteOptions
from ...runtime import ModelHandle
from ..chat import ChatRequest
from ..openai.schemas import EmbeddingRequest
from ..relay import Relay, api_key
from ..request import Request
from ..response import HandlerResult
from .base import BackendStatistics, Capabilities, FrontEnd, Relevance

# The route of the raw API (``forward(req, RAW)``): the upstream's own raw path for the
# model, the body not rewritten.
RAW = "raw"


@runtime_checkable
class RemoteConfig(Protocol):
    """What the backend needs of the served model (``models/remote.py``)."""

    config: RemoteOptions
    api_key: str | None


class RemoteBackend:
    """Relays one remote model's requests to its upstreams."""

    forwards = True

    def __init__(self, handle: ModelHandle) -> None:
        remote = handle.model
        assert isinstance(remote, RemoteConfig), "a remote model is served by its upstreams"
        key = remote.api_key if remote.api_key is not None else api_key(remote.config)
        self.handle = handle
        self.relay = Relay(handle.name, remote.config, api_key=key)

    @property
    def name(self) -> str:
        return self.handle.name

    def forward(self, req: Request, path: str) -> HandlerResult:
        """Relay ``req`` (admitted by the caller) to the upstreams' same route: ``path``
        (``/chat/completions``, ``/embeddings``, ...) or :data:`RAW`."""
        if path == RAW:
            return self.relay.forward(req, self.relay.raw_path(), rewrite_model=False)
        return self.relay.forward(req, path)

    def chat(self, api: FrontEnd, chat: ChatRequest, req: Request) -> HandlerResult:
        req.admit(self.handle)
        return self.forward(req, api.upstream_path)

    def embeddings(self, body: EmbeddingRequest, req: Request) -> HandlerResult:
        req.admit(self.handle)
        return self.forward(req, "/embeddings")

    async def prompt_tokens(self, chat: ChatRequest) -> int:
        raise AssertionError("a remote model's token counts are relayed undecoded")

    async def tokenize(
        self, text: str | None, chat: ChatRequest | None, add_special: bool
    ) -> list[int]:
        raise AssertionError("a remote model's /tokenize is relayed undecoded")

    async def detokenize(self, tokens: list[int]) -> str:
        raise AssertionError("a remote model's /detokenize is relayed undecoded")

    def rerank(self, query: str, documents: list[str], req: Request) -> Awaitable[Relevance]:
        raise AssertionError("a remote model's reranks are relayed undecoded")

    def capabilities(self) -> Capabilities:
        # Every route is relayed, /tokenize and /detokenize to the upstream's root
        # (app/extensions/routes.py): served as chat is, the upstream deciding.
        return Capabilities(
            chat=True, embeddings=True, relayed=True, token_inputs=True, tokenizer=True
        )

    def statistics(self) -> BackendStatistics:
        return BackendStatistics(
            upstreams={
                f"{self.name} {url}": stats
                for url, stats in self.relay.statistics().upstreams.items()
            }
        )

    async def aclose(self) -> None:
        await self.relay.aclose()
