"""The ``llamacpp`` backend: chat, completions and embeddings on llama.cpp's engine,
in-process (``models/llamacpp.py``), through the runtime's engine slots.

Strategy (docs/architecture.md, "The llama.cpp backend")
--------------------------------------------------------
Each choice is one engine request, encoded once from the one chat request
(:mod:`.wire`; a counted copy, ``engine_body``: the engine takes ``bytes``) and run in
one of the model's slots (``SlotPool.stream``), whose chunks :class:`~.output.EngineOutput`
decodes into pieces. Tools go through :mod:`.tools`. A chat without a system message
gets the model's default system prompt (its ``system_prompt`` option), unless a tool
plan writes its own.

Checks before a slot is taken: ``max_tokens`` at or beyond a slot's context, and a
prompt that cannot fit (``context_length_exceeded``). The prompt's UTF-8 bytes plus the
template's overhead bound its tokens (byte-level BPE), so a prompt that fits by bytes
needs no tokenizer; otherwise the engine's own template and tokenizer count it exactly
(the model's side port). An image's tokens are the projector's to say, and neither
bound knows them: a chat with images goes to the engine, which refuses a prompt beyond
the slot's context itself (a 400 naming ``messages``), and a token count of one is
refused. Images reach a model started with a projector (``mmproj``), as PNG, JPEG or
GIF (the engine decodes no WebP), at the projector's own resolution (``detail`` other
than ``auto`` is refused).
"""

from __future__ import annotations

import base64
from collections.abc import Awaitable, Callable, Sequence
from typing import Protocol, runtime_checkable

from .... import metrics
from ....errors import CapabilityError, RequestError
from ....runtime import ModelHandle, Ticket
from ...chat import ChatRequest, Choices, Output, QueuedChoice, admit
from ...chat.images import WEBP
from ...chat.request import OPTIONAL_PARAMETERS
from ...deadlines import openai_timeout
from ...openai import schemas as s
from ...request import Request
from ...response import JSON, HandlerResult, Response, StreamResponse
from ..base import BackendStatistics, Capabilities, FrontEnd, Relevance
from . import wire
from .embeddings import chunks as embedding_chunks
from .embeddings import merge as merge_embeddings
from .output import EngineOutput, engine_error
from .requests import Requests, requests
from .rerank import chunks as rerank_chunks
from .rerank import scores as rerank_scores

# Seconds to get an exact token count from the engine's tokenizer (loopback, no model
# work: milliseconds; a second means the engine is wedged).
TOKENIZE_TIMEOUT_S = 5.0
_ERROR_PREFIX = b'{"error"'
_STATS = BackendStatistics()
# The optional chat parameters llama.cpp's engine honours (every one the chat request has).
HONOURS: frozenset[str] = frozenset(OPTIONAL_PARAMETERS)


@runtime_checkable
class LlamaCppEngine(Protocol):
    """What the backend needs of the served model (``models/llamacpp.py``)."""

    alias: str
    system_prompt: str | None
    native_tools: bool
    vision: bool
    embedding: bool
    timeout: float

    @property
    def context_length(self) -> int: ...

    def schema_grammar(self, schema: bytes) -> str: ...

    def chat_call(self, payload: bytes, on_chunk: Callable[[bytes], bool]) -> None: ...

    def completion_call(self, payload: bytes, on_chunk: Callable[[bytes], bool]) -> None: ...

    def embed_call(self, payload: bytes) -> bytes: ...

    async def prompt_tokens(
        self, chat: bytes | None, prompt: str | None, timeout: float
    ) -> int: ...

    n_vocab: int

    @property
    def reranks(self) -> bool: ...

    async def side_tokenize(
        self,
        chat: bytes | None,
        prompt: str | None,
        add_special: bool,
        timeout: float,
    ) -> list[int]: ...

    async def side_detokenize(self, tokens: Sequence[int], timeout: float) -> str: ...

    def rerank_call(self, payload: bytes) -> bytes: ...


class LlamaCppBackend:
    """Serves one llama.cpp model."""

    forwards = False

    def __init__(self, handle: ModelHandle) -> None:
        engine = handle.model
        assert isinstance(engine, LlamaCppEngine), "a llamacpp model serves through its engine"
        self.handle: ModelHandle = handle
        self.engine: LlamaCppEngine = engine

    @property
    def name(self) -> str:
        return self.handle.name

    def forward(self, req: Request, path: str) -> HandlerResult:
        raise AssertionError("a llama.cpp model's requests are decoded first")

    def capabilities(self) -> Capabilities:
        return Capabilities(
            chat=True,
            embeddings=self.engine.embedding,
            honours=HONOURS,
            context_length=self.engine.context_length,
            token_inputs=self.engine.embedding,  # the engine embeds token arrays too
            tokenizer=True,
            rerank="cross-encoder" if self.engine.reranks else None,
            input_modalities=("text", "image") if self.engine.vision else ("text",),
        )

    def statistics(self) -> BackendStatistics:
        return _STATS

    async def aclose(self) -> None:
        pass

    def _deadline(self, client_timeout: float | None) -> float:
        """The engine's own timeout (the ``timeout`` option), shortened to the client's
        and capped by the model's limit."""
        timeout = self.engine.timeout
        if client_timeout is not None:
            timeout = min(timeout, client_timeout)
        return self.handle.deadline(timeout)

    # -- chat and completions ----------------------------------------------------------
    def chat(self, api: FrontEnd, chat: ChatRequest, req: Request) -> HandlerResult:
        engine = self.engine
        chat.refuse_unhonoured(HONOURS)
        if chat.images:
            _check_images(chat)
        planned = requests(chat, engine)
        deadline = self._deadline(chat.timeout)
        ctx = engine.context_length
        want = chat.max_tokens or 0
        if want >= ctx:
            param = chat.param("max_tokens")
            raise RequestError(
                f"this model's maximum context length is {ctx} tokens; {param} asks for {want}",
                param=param,
                code="context_length_exceeded",
            )
        if planned.bound + want < ctx or chat.images:
            return self._start(api, chat, req, planned, deadline)
        return self._counted(api, chat, req, planned, deadline)

    async def prompt_tokens(self, chat: ChatRequest) -> int:
        """Counted by the engine's own template and tokenizer (its side port), the
        conversation as the engine would be sent it (a tool plan's system turn too)."""
        chat.refuse_unhonoured(HONOURS)
        if chat.images:
            raise RequestError(
                "this model's engine cannot count an image's tokens apart from running it; "
                "count the text alone",
                param=chat.images[0].param,
            )
        planned = requests(chat, self.engine)
        timeout = max(min(TOKENIZE_TIMEOUT_S, self.engine.timeout), 0.001)
        return await self.engine.prompt_tokens(planned.chat, None, timeout)

    # -- tokens ----------------------------------------------------------------------------
    async def tokenize(
        self, text: str | None, chat: ChatRequest | None, add_special: bool
    ) -> list[int]:
        """By the engine's own tokenizer and chat template (its side port); a
        conversation as the engine would be sent it (its default system prompt, its
        tools and a tool plan's system turn too)."""
        if chat is not None:
            chat.refuse_unhonoured(HONOURS)
        body = requests(chat, self.engine).chat if chat is not None else None
        return await self.engine.side_tokenize(body, text, add_special, self._side_timeout())

    async def detokenize(self, tokens: list[int]) -> str:
        size = self.engine.n_vocab
        bad = next((t for t in tokens if not 0 <= t < size), None)
        if bad is not None:
            raise RequestError(
                f"token {bad} is outside the vocabulary (0..{size - 1})", param="tokens"
            )
        return await self.engine.side_detokenize(tokens, self._side_timeout())

    def _side_timeout(self) -> float:
        return max(min(TOKENIZE_TIMEOUT_S, self.engine.timeout), 0.001)

    # -- rerank ----------------------------------------------------------------------------
    def rerank(self, query: str, documents: list[str], req: Request) -> Awaitable[Relevance]:
        if not self.engine.reranks:
            raise CapabilityError(
                f"model {self.name!r} is not a reranker; serve a reranker GGUF with the "
                "options embedding=true&pooling=rank",
                param="model",
            )
        parts = rerank_chunks(query, documents)
        for _, payload in parts:
            metrics.count_copy("engine_body", len(payload))
        deadline = self._deadline(openai_timeout(req))
        ticket = self.handle.admit(req.priority)  # its class, as chat's; Overloaded: 429
        return self._rerank(req, parts, ticket, deadline)

    async def _rerank(
        self, req: Request, parts: list[tuple[int, bytes]], ticket: Ticket, deadline: float
    ) -> Relevance:
        def call(payload: bytes) -> Callable[[], bytes]:
            return _engine_call(self.engine.rerank_call, payload, "documents")

        sizes = [n for n, _ in parts]
        answers = await self.handle.slots.run(
            ticket, [call(p) for _, p in parts], deadline=deadline, items=sizes
        )
        relevance = rerank_scores(list(answers), sizes)
        if req.edge is not None:  # an API key's token quota
            req.edge.model = self.name
            req.edge.count_tokens(relevance.tokens)
        return relevance

    async def _counted(
        self, api: FrontEnd, chat: ChatRequest, req: Request, planned: Requests, deadline: float
    ) -> Response | StreamResponse:
        """The exact prompt-token check, then the start (a prompt the bytes bound could
        not clear)."""
        ctx = self.engine.context_length
        want = chat.max_tokens or 0
        timeout = max(min(TOKENIZE_TIMEOUT_S, deadline - self.handle.clock()), 0.001)
        prompts = planned.prompts
        for prompt in prompts if prompts is not None else [None]:
            tokens = await self.engine.prompt_tokens(planned.chat, prompt, timeout)
            if tokens + want >= ctx:
                raise RequestError(
                    f"this model's maximum context length is {ctx} tokens; the request has "
                    f"{tokens} prompt tokens and asks for up to {want} more",
                    param=chat.param("messages" if chat.chat else "prompt"),
                    code="context_length_exceeded",
                )
        answer = self._start(api, chat, req, planned, deadline)
        if isinstance(answer, Response | StreamResponse):
            return answer
        return await answer

    def _start(
        self, api: FrontEnd, chat: ChatRequest, req: Request, planned: Requests, deadline: float
    ) -> HandlerResult:
        handle = self.handle
        bodies, tool_plan, error_param = planned.bodies, planned.plan, planned.error_param
        for body in bodies:
            metrics.count_copy("engine_body", len(body))
        tickets = admit(handle, len(bodies), req.priority)
        edge = req.edge
        on_tokens = edge.count_tokens if edge is not None else None
        call = self.engine.chat_call if chat.chat else self.engine.completion_call
        n = chat.n

        def start(index: int, ticket: Ticket) -> Output:
            stream = handle.slots.stream(ticket, call, bodies[index], deadline=deadline)
            out = EngineOutput(
                index,
                stream,
                handle.name,
                error_param=error_param,
                on_tokens=on_tokens,
                count_prompt=index % n == 0,
            )
            return tool_plan.output(out) if tool_plan is not None else out

        pending = [QueuedChoice(k, t, start) for k, t in enumerate(tickets)]
        if edge is not None:
            edge.model = handle.name
            if edge.trace is not None:  # each choice's wait for a slot, traced
                for p in pending:
                    p.watch(edge.trace.queue_watch())
        return api.respond(Choices(pending), chat, req)

    # -- embeddings ------------------------------------------------------------------------
    def embeddings(self, body: s.EmbeddingRequest, req: Request) -> HandlerResult:
        """OpenAI's embeddings from the engine (a model started with ``embedding=true``):
        its answer, already OpenAI's shape, is sent as it comes (merged when the
        inputs took several engine calls)."""
        if not self.engine.embedding:
            raise CapabilityError(
                f"model {self.name!r} was started without embeddings; "
                "serve it with the option embedding=true",
                param="model",
            )
        parts = embedding_chunks(body, self.engine.alias)
        for _, payload in parts:
            metrics.count_copy("engine_body", len(payload))
        deadline = self._deadline(openai_timeout(req))
        ticket = self.handle.admit(req.priority)  # Overloaded: 429
        return self._embed(req, parts, ticket, deadline, body.dimensions)

    async def _embed(
        self,
        req: Request,
        parts: list[tuple[int, bytes]],
        ticket: Ticket,
        deadline: float,
        dimensions: int | None,
    ) -> Response:
        def call(payload: bytes) -> Callable[[], bytes]:
            return _engine_call(self.engine.embed_call, payload, "input")

        answers = await self.handle.slots.run(
            ticket, [call(p) for _, p in parts], deadline=deadline, items=[n for n, _ in parts]
        )
        answer = answers[0] if len(answers) == 1 else merge_embeddings(answers)
        if dimensions is not None:
            vectors = wire.embeddings_decoder.decode(answer).data
            native = _dimension(vectors[0].embedding) if vectors else dimensions
            if native != dimensions:
                raise RequestError(
                    f"model {self.name!r} returns {native}-dimensional embeddings and cannot "
                    "shorten them; omit 'dimensions' or pass its native size",
                    param="dimensions",
                )
        if req.edge is not None:  # an API key's token quota
            req.edge.model = self.name
            req.edge.count_tokens(wire.usage_decoder.decode(answer).usage.prompt_tokens)
        return Response(200, [answer], content_type=JSON)


def _engine_call(
    method: Callable[[bytes], bytes], payload: bytes, param: str
) -> Callable[[], bytes]:
    """One blocking engine call for a slot thread: an input the engine refuses before
    computing is a 400 naming ``param``; an error answer is its HTTP error."""

    def run() -> bytes:
        try:
            answer = method(payload)
        except ValueError as exc:
            raise RequestError(f"the engine refused the input: {exc}", param=param) from None
        if answer.startswith(_ERROR_PREFIX):
            raise engine_error(answer)
        return answer

    return run


def _check_images(chat: ChatRequest) -> None:
    """A 400 naming the first image the engine cannot read as asked."""
    for image in chat.images:
        if image.media_type == WEBP:
            raise RequestError(
                "this model's engine reads PNG, JPEG and GIF images, not WebP",
                param=image.param,
                code="invalid_image",
            )
        if image.detail not in (None, "auto"):
            raise RequestError(
                "this model reads every image at its projector's own resolution; "
                "only detail 'auto' is honoured",
                param=image.detail_param,
            )


def _dimension(vector: list[float] | str) -> int:
    """Floats in one engine vector (a base64 one holds little-endian float32s)."""
    if isinstance(vector, str):
        return len(base64.b64decode(vector)) // 4
    return len(vector)
