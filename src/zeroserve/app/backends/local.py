"""The ``local`` backend: a model's own ``generate`` and ``embed`` (``tinyllm``,
``echo``, ``minilm``, the transformers backends, users' models), through the runtime's
admission, executors and streams.

Each choice (a prompt, or the templated conversation, times ``n``) is one
``handle.generate`` stream, read by a :class:`~.generation.Generation`. ``Model.generate``
takes a prompt, ``max_tokens``, ``temperature``, ``top_p``, ``seed`` and ``stop``, and
the sampling extensions its model declares it honours (``Model.honours``: ``tinyllm``
honours vLLM's ``top_k``, ``min_p``, ``repetition_penalty``, ``ignore_eos`` and
``min_tokens``); every other sampling or output parameter is refused with a 400 naming
it unless it is given at its neutral value (the one that changes nothing: a ``0``
penalty, no tools, a ``text`` format), so nothing is silently dropped. With a ``seed``, choice ``j`` of a prompt uses
``seed + j``: choice 0 equals the ``n = 1`` answer and the others differ.

Token counts come from the model's ``count_tokens``; ``usage.prompt_tokens`` counts the
templated chat prompt, each prompt once. An API key's token quota is debited as the
tokens are made (docs/architecture.md, "The edge").
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import numpy as np

from ...errors import CapabilityError, RequestError
from ...models.base import GENERATE_EXTENSIONS, GenerateRequest, Model
from ...runtime import ModelHandle, Ticket
from ..chat import ChatRequest, Choices, Output, QueuedChoice, Turn, admit
from ..deadlines import openai_timeout
from ..limits import SEED_SPACE
from ..openai import schemas as s
from ..request import Request
from ..response import JSON, HandlerResult, Response
from .base import BackendStatistics, Capabilities, FrontEnd, Relevance
from .generation import Generation, count_tokens

_STATS = BackendStatistics()


def honoured(meta: Model) -> frozenset[str]:
    """The optional chat parameters ``meta``'s ``generate`` honours: the sampling
    extensions it declares (``Model.honours``) that ``GenerateRequest`` carries."""
    return frozenset(meta.honours) & GENERATE_EXTENSIONS


class LocalBackend:
    """Serves a model's own ``generate`` and ``embed``."""

    forwards = False

    def __init__(self, handle: ModelHandle) -> None:
        self.handle = handle

    @property
    def name(self) -> str:
        return self.handle.name

    def forward(self, req: Request, path: str) -> HandlerResult:
        raise AssertionError("a local model's requests are decoded first")

    def capabilities(self) -> Capabilities:
        caps = self.handle.capabilities
        return Capabilities(
            chat="generate" in caps,
            embeddings="embed" in caps,
            honours=honoured(self.handle.model),
            context_length=self.handle.model.context_length,
            embedding_dimensions=self.handle.model.embedding_dimensions,
            tokenizer=self.handle.model.has_tokenizer(),
            # The cosine of the embeddings: no model here reads query and document together.
            rerank="bi-encoder" if "embed" in caps else None,
        )

    def statistics(self) -> BackendStatistics:
        return _STATS

    async def aclose(self) -> None:
        pass

    # -- chat ------------------------------------------------------------------------------
    def chat(self, api: FrontEnd, chat: ChatRequest, req: Request) -> HandlerResult:
        handle = self.handle
        if "generate" not in handle.capabilities:
            raise CapabilityError(
                f"model {handle.name!r} does not support text generation", param="model"
            )
        chat.refuse_unhonoured(honoured(handle.model))
        if chat.continues:
            # A model's chat template opens a new assistant turn after the conversation.
            raise chat.refuse(
                "messages",
                "ends with an assistant turn to continue (a prefill), which this model "
                "cannot do: its chat template always starts a new turn",
            )
        meta = handle.model
        if chat.messages is not None:
            turns = [_turn(m, i, chat) for i, m in enumerate(chat.messages)]
            prompts = [meta.chat_template(turns)]
        else:
            assert chat.prompts is not None
            prompts = chat.prompts
        counts = [count_tokens(meta, p) for p in prompts]
        ctx = meta.context_length
        want = chat.max_tokens or 0
        if ctx is not None:
            for c in counts:
                if c >= ctx or c + want > ctx:
                    raise RequestError(
                        f"this model's maximum context length is {ctx} tokens; the request "
                        f"has {c} prompt tokens and asks for up to {want} more",
                        param=chat.param("messages" if chat.chat else "prompt"),
                        code="context_length_exceeded",
                    )
        deadline = handle.deadline(chat.timeout)
        tickets = admit(handle, len(prompts) * chat.n, req.priority)
        edge = req.edge
        on_tokens = edge.count_tokens if edge is not None else None
        pending: list[QueuedChoice] = []
        for i, (prompt, c) in enumerate(zip(prompts, counts, strict=True)):
            for j in range(chat.n):
                greq = GenerateRequest(
                    prompt=prompt,
                    max_tokens=chat.max_tokens,
                    temperature=1.0 if chat.temperature is None else chat.temperature,
                    top_p=1.0 if chat.top_p is None else chat.top_p,
                    seed=None if chat.seed is None else (chat.seed + j) % SEED_SPACE,
                    # Reported stops are matched by the Generation's filter, in sight.
                    stop=[] if chat.report_stop else chat.stop,
                    top_k=chat.top_k,
                    min_p=chat.min_p or 0.0,
                    repetition_penalty=chat.repetition_penalty or 1.0,
                    ignore_eos=chat.ignore_eos,
                    min_tokens=chat.min_tokens or 0,
                )
                k = i * chat.n + j
                start = self._starter(greq, chat.stop, c, deadline, on_tokens)
                pending.append(QueuedChoice(k, tickets[k], start))
        if edge is not None:
            edge.model = handle.name
            edge.count_tokens(sum(counts))
            if edge.trace is not None:  # each generation's queue wait, traced
                for p in pending:
                    p.watch(edge.trace.queue_watch())
        return api.respond(Choices(pending, sum(counts)), chat, req)

    async def prompt_tokens(self, chat: ChatRequest) -> int:
        handle = self.handle
        if "generate" not in handle.capabilities:
            raise CapabilityError(
                f"model {handle.name!r} does not support text generation", param="model"
            )
        chat.refuse_unhonoured(honoured(handle.model))
        assert chat.messages is not None
        turns = [_turn(m, i, chat) for i, m in enumerate(chat.messages)]
        return count_tokens(handle.model, handle.model.chat_template(turns))

    def _starter(
        self,
        greq: GenerateRequest,
        stop: list[str],
        prompt_tokens: int,
        deadline: float,
        on_tokens: Callable[[int], None] | None,
    ) -> Callable[[int, Ticket], Output]:
        handle = self.handle

        def start(index: int, ticket: Ticket) -> Output:
            stream = handle.generate(ticket, greq, deadline=deadline)
            return Generation(
                stream,
                handle.model,
                index=index,
                max_tokens=greq.max_tokens,
                prompt_tokens=prompt_tokens,
                stop=stop,
                on_tokens=on_tokens,
                model=handle.name,
            )

        return start

    # -- tokens ----------------------------------------------------------------------------
    async def tokenize(
        self, text: str | None, chat: ChatRequest | None, add_special: bool
    ) -> list[int]:
        meta = self._tokenizer()
        if chat is not None:
            if "generate" not in self.handle.capabilities:
                raise CapabilityError(
                    f"model {self.name!r} has no chat template: send a prompt, not messages",
                    param="messages",
                )
            assert chat.messages is not None
            chat.refuse_unhonoured(honoured(self.handle.model))  # tools, as its chat does
            text = meta.chat_template([_turn(m, i, chat) for i, m in enumerate(chat.messages)])
        assert text is not None
        return meta.tokenize(text, add_special)

    async def detokenize(self, tokens: list[int]) -> str:
        meta = self._tokenizer()
        try:
            return meta.detokenize(tokens)
        except ValueError as exc:
            raise RequestError(str(exc), param="tokens") from None

    def _tokenizer(self) -> Model:
        meta = self.handle.model
        if not meta.has_tokenizer():
            raise CapabilityError(f"model {self.name!r} has no tokenizer", param="model")
        return meta

    # -- rerank ----------------------------------------------------------------------------
    def rerank(self, query: str, documents: list[str], req: Request) -> Awaitable[Relevance]:
        """The cosine of the query's embedding and each document's (a bi-encoder), the
        texts embedded in one request, which the runtime batches like embeddings."""
        handle = self.handle
        if "embed" not in handle.capabilities:
            raise CapabilityError(
                f"model {handle.name!r} cannot rerank: it makes no embeddings", param="model"
            )
        deadline = handle.deadline(openai_timeout(req))
        req.admit(handle)  # the request owns the ticket until the engine takes it
        if req.edge is not None:
            req.edge.model = handle.name
        return self._rerank(req, [query, *documents], deadline)

    async def _rerank(self, req: Request, texts: list[str], deadline: float) -> Relevance:
        handle = self.handle
        vecs = await handle.embed(req.take_ticket(), texts, deadline=deadline)
        vecs = np.asarray(vecs, dtype=np.float32)
        norms = np.linalg.norm(vecs, axis=1)
        norms[norms == 0] = 1.0  # a zero vector scores 0 against anything
        unit = vecs / norms[:, None]
        scores = unit[1:] @ unit[0]
        tokens = sum(count_tokens(handle.model, t) for t in texts)
        if req.edge is not None:
            req.edge.count_tokens(tokens)
        return Relevance([float(x) for x in scores], tokens)

    # -- embeddings ------------------------------------------------------------------------
    def embeddings(self, body: s.EmbeddingRequest, req: Request) -> HandlerResult:
        handle = self.handle
        if "embed" not in handle.capabilities:
            raise CapabilityError(
                f"model {handle.name!r} does not support embeddings", param="model"
            )
        texts = _texts(body.input)
        width = handle.model.embedding_dimensions
        if body.dimensions is not None and width is not None and body.dimensions != width:
            raise _not_shortened(handle.name, width)  # refused before the model runs
        deadline = handle.deadline(openai_timeout(req))
        req.admit(handle)  # the request owns the ticket until the engine takes it
        if req.edge is not None:
            req.edge.model = handle.name
        return self._embed(req, texts, body, deadline)

    async def _embed(
        self, req: Request, texts: list[str], body: s.EmbeddingRequest, deadline: float
    ) -> Response:
        handle = self.handle
        vecs = await handle.embed(req.take_ticket(), texts, deadline=deadline)
        if body.dimensions is not None and body.dimensions != vecs.shape[1]:
            raise _not_shortened(handle.name, vecs.shape[1])
        if body.encoding_format == "base64":
            # base64 of little-endian float32 bytes; msgspec writes bytes as base64.
            rows = np.ascontiguousarray(vecs, dtype="<f4")
            values: list[Any] = [memoryview(row).cast("B") for row in rows]
        else:
            values = vecs.tolist()
        data = [s.Embedding("embedding", i, v) for i, v in enumerate(values)]
        tokens = sum(count_tokens(handle.model, t) for t in texts)
        if req.edge is not None:
            req.edge.count_tokens(tokens)
        usage = s.EmbeddingUsage(tokens, tokens)
        return Response(
            200,
            [s.encoder.encode(s.EmbeddingList("list", data, handle.name, usage))],
            content_type=JSON,
        )


def _turn(m: Turn, i: int, chat: ChatRequest) -> dict[str, str]:
    """A message as ``Model.chat_template`` takes it (role and text)."""
    if m.tool_calls:
        raise chat.refuse(
            f"messages[{i}].tool_calls" if chat.param("messages") == "messages" else "messages",
            "is not supported by this model: it has no tool calls",
        )
    return {"role": m.role, "content": m.content or ""}


def _texts(value: str | list[Any]) -> list[str]:
    if isinstance(value, str):
        return [value]
    if all(isinstance(v, str) for v in value):
        return list(value)
    raise RequestError(
        "token-array inputs are not supported by this model; send text", param="input"
    )


def _not_shortened(model: str, width: int) -> RequestError:
    return RequestError(
        f"model {model!r} returns {width}-dimensional embeddings and cannot shorten them; "
        "omit 'dimensions' or pass its native size",
        param="dimensions",
    )
