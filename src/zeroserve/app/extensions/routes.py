"""The routes of vLLM's and llama.cpp's extensions (docs/extensions.md): ``POST
/tokenize`` and ``POST /detokenize`` at the root, as vLLM and llama.cpp's server serve
them, and ``POST /v1/rerank`` with its aliases ``/rerank`` and ``/v2/rerank``.

Each is one decode at the boundary (unknown fields refused by name, the counts and
sizes checked) and one call of the model's backend (``app/backends/base.py``:
``tokenize``, ``detokenize``, ``rerank``); errors in OpenAI's shape, as vLLM answers
them. Each is model work, so each takes a ticket of its model's queue, as a chat does (a
429 past the bound). A relayed model's requests go to its upstream undecoded: a rerank to the base
URL's ``/rerank``, ``/tokenize`` and ``/detokenize`` to the upstream's own, at its root
(the base URL without a final ``/v1``, where vLLM and llama.cpp's server serve them).
"""

from __future__ import annotations

import os
from collections.abc import Awaitable

import msgspec
from msgspec import UNSET

from ...errors import RequestError
from ..backends import Backends
from ..backends.base import Backend, Relevance
from ..chat import ChatRequest
from ..chat.images import ImageReader
from ..limits import ApiLimits, check_count
from ..openai import schemas as s
from ..openai.chat import decode_tools, turn
from ..request import Request
from ..response import JSON, HandlerResult, Response
from ..router import RouteDoc, Router
from . import contract
from . import schemas as x

tokenize_decoder = msgspec.json.Decoder(x.TokenizeRequest)
detokenize_decoder = msgspec.json.Decoder(x.DetokenizeRequest)
rerank_decoder = msgspec.json.Decoder(x.RerankRequest)
# Where vLLM and llama.cpp's server (and Cohere's v2 API) serve a rerank.
RERANK_PATHS = ("/v1/rerank", "/rerank", "/v2/rerank")


def register(router: Router, backends: Backends, limits: ApiLimits | None = None) -> None:
    api = _Extensions(backends, limits or ApiLimits())
    router.add(
        "POST",
        "/tokenize",
        api.tokenize,
        doc=RouteDoc(
            "Tokenize a prompt or a conversation (vLLM, llama.cpp)",
            x.TokenizeRequest,
            x.TokenizeResponse,
            False,
            contract.TOKENIZE,
        ),
    )
    router.add(
        "POST",
        "/detokenize",
        api.detokenize,
        doc=RouteDoc(
            "The text of token ids (vLLM, llama.cpp)",
            x.DetokenizeRequest,
            x.DetokenizeResponse,
            False,
            contract.DETOKENIZE,
        ),
    )
    for path in RERANK_PATHS:
        router.add(
            "POST",
            path,
            api.rerank,
            doc=RouteDoc(
                "Rerank documents against a query (Jina, Cohere, vLLM, llama.cpp)",
                x.RerankRequest,
                x.RerankResponse,
                False,
                contract.RERANK,
            ),
        )


def _json(obj: object) -> Response:
    return Response(200, [s.encoder.encode(obj)], content_type=JSON)


class _Extensions:
    def __init__(self, backends: Backends, limits: ApiLimits) -> None:
        self.backends = backends
        self.limits = limits

    # -- tokens ----------------------------------------------------------------------------
    def tokenize(self, req: Request) -> HandlerResult:
        relayed = self.backends.relayed(req, "/tokenize")
        if relayed is not None:
            return relayed
        body = s.decode(tokenize_decoder, req.body)
        if not self.backends.loadable(body.model):
            self.backends.get(body.model)  # a 404 before the body's own 400s
        text, chat = self._input(body)
        if body.add_special_tokens is not UNSET and body.add_special is not UNSET:
            raise RequestError(
                "add_special_tokens and add_special are one setting; send one",
                param="add_special",
            )
        add = body.add_special_tokens if body.add_special_tokens is not UNSET else body.add_special
        if add is UNSET:  # vLLM's default for a prompt; llama.cpp's for content
            add = body.prompt is not UNSET
        return self.backends.served(
            body.model,
            req,
            "/tokenize",  # model work: a ticket
            lambda _: _tokenized(self.backends.admitted(body.model, req), text, chat, bool(add)),
        )

    def _input(self, body: x.TokenizeRequest) -> tuple[str | None, ChatRequest | None]:
        given = [
            name
            for name, value in (
                ("prompt", body.prompt),
                ("content", body.content),
                ("messages", body.messages),
            )
            if value is not UNSET
        ]
        if len(given) != 1:
            raise RequestError(
                "send exactly one of prompt, content or messages",
                param=given[1] if len(given) > 1 else "prompt",
            )
        for name, bad in (
            ("add_generation_prompt", body.add_generation_prompt is False),
            ("return_token_strs", bool(body.return_token_strs)),
            ("with_pieces", bool(body.with_pieces)),
        ):
            if bad:
                raise RequestError(f"'{name}' is not supported by this server", param=name)
        if isinstance(body.messages, list):
            messages = body.messages
            check_count(len(messages), self.limits.messages, "messages", "messages")
            images = ImageReader(self.limits)
            turns = [turn(m, i, images) for i, m in enumerate(messages)]
            if images.count:
                raise RequestError("/tokenize does not count images", param="messages")
            size = sum(len((t.content or "").encode()) for t in turns)
            _check_size(size, "messages")
            tools, choice = decode_tools(body.tools, body.tool_choice, self.limits)
            chat = ChatRequest(model=body.model, messages=turns, tools=tools, tool_choice=choice)
            return None, chat
        for name, raw in (("tools", body.tools), ("tool_choice", body.tool_choice)):
            if raw is not UNSET:
                raise RequestError(f"{name} goes with messages, not a text", param=name)
        text = body.prompt if isinstance(body.prompt, str) else body.content
        assert isinstance(text, str)
        _check_size(len(text.encode()), given[0])
        return text, None

    def detokenize(self, req: Request) -> HandlerResult:
        relayed = self.backends.relayed(req, "/detokenize")
        if relayed is not None:
            return relayed
        body = s.decode(detokenize_decoder, req.body)
        return self.backends.served(
            body.model,
            req,
            "/detokenize",
            lambda _: _detokenized(self.backends.admitted(body.model, req), body.tokens),
        )

    # -- rerank ----------------------------------------------------------------------------
    def rerank(self, req: Request) -> HandlerResult:
        relayed = self.backends.relayed(req, "/rerank")
        if relayed is not None:
            return relayed
        body = s.decode(rerank_decoder, req.body)
        docs = [d if isinstance(d, str) else d.text for d in body.documents]
        check_count(len(docs), self.limits.embedding_inputs, "documents", "documents")
        req.ask_priority(body.priority)  # over x-priority and the key's default
        return self.backends.served(
            body.model,
            req,
            "/rerank",
            lambda b: _reranked(b.rerank(body.query, docs, req), body, docs),
        )


def _check_size(size: int, param: str) -> None:
    if size > x.MAX_TOKENIZE_BYTES:
        raise RequestError(
            f"{param} is {size} bytes; at most {x.MAX_TOKENIZE_BYTES} are tokenized at once",
            param=param,
            code="limit_exceeded",
        )


async def _tokenized(
    backend: Backend, text: str | None, chat: ChatRequest | None, add: bool
) -> Response:
    tokens = await backend.tokenize(text, chat, add)
    context = backend.capabilities().context_length
    return _json(x.TokenizeResponse(len(tokens), context, tokens))


async def _detokenized(backend: Backend, tokens: list[int]) -> Response:
    text = await backend.detokenize(tokens)
    return _json(x.DetokenizeResponse(text, text))


async def _reranked(work: Awaitable[Relevance], body: x.RerankRequest, docs: list[str]) -> Response:
    relevance = await work
    order = sorted(range(len(docs)), key=lambda i: -relevance.scores[i])
    if body.top_n:
        order = order[: body.top_n]
    keep = body.return_documents is not False
    results = [
        x.RerankResult(i, relevance.scores[i], x.RerankDocument(text=docs[i]))
        if keep
        else x.RerankResult(i, relevance.scores[i])
        for i in order
    ]
    usage = x.RerankUsage(relevance.tokens, relevance.tokens)
    return _json(
        x.RerankResponse("rerank-" + os.urandom(12).hex(), "list", body.model, results, usage)
    )
