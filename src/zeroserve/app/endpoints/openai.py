"""The OpenAI-compatible API: ``/v1/models``, ``/v1/chat/completions``,
``/v1/completions``, ``/v1/embeddings`` and ``/v1/responses``.

Requests are decoded once, from the body view, by the reused msgspec decoders in
``app/openai/schemas.py``; errors use OpenAI's ``{"error": {...}}`` body (the routes'
``errors="openai"``) and never echo the input. The model name is in the body, so the
model lookup (404) and admission (429) happen when the body is complete, before any
work: one ticket per choice, all taken up front. Each job owns its ticket until its
generation starts and takes it (``_Job.take_ticket``); the request's end releases the
tickets of jobs that never started (``_Job.release``).

Choices: ``n`` > 1 (and, for ``/v1/completions``, a list of prompts) is supported. Each
choice is its own generation: concurrent for a whole response, one after another for a
stream (see ``app/openai/streaming.py``). With a ``seed``, choice ``j`` of a prompt uses
``seed + j``, so choice 0 equals the ``n = 1`` answer and the others differ.

Unsupported OpenAI parameters that would change the answer (``logprobs``, ``tools``,
``response_format``, penalties, ``echo``, ``best_of`` > 1, ``suffix``, non-text content
parts, token-array prompts; see ``app/openai/params.py``) and unknown fields get a 400
naming the parameter rather than being silently ignored. Parameters that only carry
metadata (``user``, ``metadata``, ``store``, ...) are accepted and ignored.
``llamacpp`` models are served by their engine (``app/engine_relay.py``), which honours
``tools``, ``response_format``, ``logprobs``, penalties and ``logit_bias``, answers the
Responses API (``app/engine_responses.py``; other models: relayed when remote, else a
400) and, started with ``embedding=true``, embeddings.

Token counts come from the model's ``count_tokens``; ``usage.prompt_tokens`` counts the
templated chat prompt. See ``app/openai/generation.py`` for how ``finish_reason`` and
``completion_tokens`` are determined.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Callable, Coroutine, Sequence
from typing import Any, Literal, TypeVar

import numpy as np

from ...edge import EdgeContext
from ...errors import CapabilityError, ModelNotFound, RequestError
from ...models.base import GenerateRequest
from ...runtime import Engine, ModelHandle, QueueWatch, Ticket
from ...runtime.channel import PULL_YIELD_EVERY
from ..deadlines import openai_timeout
from ..engine_relay import engine_for_request
from ..engine_tools import release_ticket
from ..limits import SEED_SPACE, ApiLimits, check_count, check_output_tokens
from ..openai import schemas as s
from ..openai.chunks import Chunks
from ..openai.generation import Generation, count_tokens
from ..openai.params import refuse_unsupported
from ..openai.streaming import ChoiceStream
from ..relay import relay_for_request
from ..request import Request
from ..response import JSON, HandlerResult, Response, StreamResponse
from ..router import Router


def register(router: Router, engine: Engine, limits: ApiLimits | None = None) -> None:
    api = _OpenAI(engine, limits or ApiLimits())
    router.add("GET", "/v1/models", api.list_models)
    router.add("GET", "/v1/models/{model}", api.get_model)
    router.add("POST", "/v1/chat/completions", api.chat)
    router.add("POST", "/v1/completions", api.completions)
    router.add("POST", "/v1/embeddings", api.embeddings)
    router.add("POST", "/v1/responses", api.responses)


_T = TypeVar("_T")


def _json(obj: Any) -> Response:
    return Response(200, [s.encoder.encode(obj)], content_type=JSON)


async def _all_or_none(coros: list[Coroutine[Any, Any, _T]]) -> list[_T]:
    """Run ``coros`` as tasks and return their results, in order; the first failure
    cancels the rest, is waited out with them, and is raised as the request's (a 504, a
    model failure, ...). What ``asyncio.TaskGroup`` does, without its ``async with``:
    see ``_whole``."""
    tasks = [asyncio.ensure_future(c) for c in coros]
    failure: BaseException | None = None
    try:
        return await asyncio.gather(*tasks)
    except BaseException as exc:  # a choice failed, or this request was cancelled
        failure = exc
    for task in tasks:
        task.cancel()
    await asyncio.wait(tasks)
    raise failure


def _new_id(prefix: str) -> str:
    return prefix + os.urandom(12).hex()


class _Job:
    """One choice to generate: a prompt, its sampling request and its ticket (owned
    until the generation starts with it)."""

    __slots__ = (
        "_ticket",
        "deadline",
        "index",
        "max_tokens",
        "on_tokens",
        "prompt_tokens",
        "request",
    )

    def __init__(
        self,
        index: int,
        request: GenerateRequest,
        prompt_tokens: int,
        ticket: Ticket,
        deadline: float,
    ) -> None:
        self.on_tokens: Callable[[int], None] | None = None  # the edge's token count
        self.deadline = deadline
        self.index = index
        self.request = request
        self.max_tokens = request.max_tokens
        self.prompt_tokens = prompt_tokens
        self._ticket: Ticket | None = ticket

    def take_ticket(self) -> Ticket:
        ticket, self._ticket = self._ticket, None
        assert ticket is not None, "a job's generation starts once"
        return ticket

    def watch(self, watch: QueueWatch) -> None:
        """Tell ``watch`` when this choice's generation waits for a worker and starts."""
        assert self._ticket is not None
        self._ticket.watch = watch

    def release(self) -> None:
        """Release the ticket if the generation never started (it owns it otherwise)."""
        ticket, self._ticket = self._ticket, None
        if ticket is not None:
            ticket.release()


class _OpenAI:
    def __init__(self, engine: Engine, limits: ApiLimits) -> None:
        self.engine = engine
        self.limits = limits
        self.created = int(time.time())

    # -- models ------------------------------------------------------------------------
    def _model(self, name: str, param: str | None) -> ModelHandle:
        try:
            return self.engine.model(name)
        except ModelNotFound:
            # The message does not repeat the name: error bodies never echo input.
            raise ModelNotFound(
                "the requested model is not served here; GET /v1/models lists the models",
                param=param,
            ) from None

    def _card(self, name: str) -> s.ModelCard:
        handle = self._model(name, None)
        meta = handle.model
        builtin = type(meta).__module__.startswith("zeroserve.")
        description = (
            meta.description or f"{type(meta).__name__} ({', '.join(sorted(handle.capabilities))})"
        )
        return s.ModelCard(
            id=name,
            object="model",
            created=self.created,
            owned_by="zeroserve" if builtin else "user",
            description=description,
        )

    def list_models(self, req: Request) -> Response:
        cards = [self._card(name) for name in self.engine.names()]
        return _json(s.ModelList(object="list", data=cards))

    def get_model(self, req: Request) -> Response:
        return _json(self._card(req.params["model"]))

    # -- shared ------------------------------------------------------------------------
    def _handle(self, name: str, capability: str) -> ModelHandle:
        handle = self._model(name, "model")
        if capability not in handle.capabilities:
            what = {"generate": "text generation", "embed": "embeddings"}[capability]
            raise CapabilityError(f"model {handle.name!r} does not support {what}", param="model")
        return handle

    def _admit(self, handle: ModelHandle, count: int) -> list[Ticket]:
        tickets: list[Ticket] = []
        try:
            for _ in range(count):
                tickets.append(handle.admit())  # Overloaded: 429
        except BaseException:
            for t in tickets:
                t.release()
            raise
        return tickets

    def _jobs(
        self,
        handle: ModelHandle,
        prompts: Sequence[str],
        n: int,
        *,
        max_tokens: int | None,
        stop: str | list[str] | None,
        temperature: float | None,
        top_p: float | None,
        seed: int | None,
        deadline: float,
        max_tokens_param: str = "max_tokens",
    ) -> tuple[list[_Job], int]:
        """One job per (prompt, choice), indexed as OpenAI does (prompt-major); and the
        prompt tokens of the request (each prompt counted once)."""
        limits = self.limits
        check_count(n, limits.n, "n", "choices")
        check_count(len(prompts) * n, limits.generations, "n", "generations (prompts x n)")
        check_output_tokens(len(prompts) * n, max_tokens, limits, max_tokens_param)
        meta = handle.model
        counts = [count_tokens(meta, p) for p in prompts]
        ctx = meta.context_length
        if ctx is not None:
            for c in counts:
                want = c + (max_tokens or 0)
                if c >= ctx or want > ctx:
                    raise RequestError(
                        f"this model's maximum context length is {ctx} tokens; the request "
                        f"has {c} prompt tokens and asks for up to {max_tokens or 0} more",
                        param="messages" if len(prompts) == 1 else "prompt",
                        code="context_length_exceeded",
                    )
        stops = [stop] if isinstance(stop, str) else list(stop or ())
        check_count(len(stops), limits.stop, "stop", "stop sequences")
        stops = [x for x in stops if x]
        tickets = self._admit(handle, len(prompts) * n)
        jobs: list[_Job] = []
        for i, (prompt, c) in enumerate(zip(prompts, counts, strict=True)):
            for j in range(n):
                greq = GenerateRequest(
                    prompt=prompt,
                    max_tokens=max_tokens,
                    temperature=1.0 if temperature is None else temperature,
                    top_p=1.0 if top_p is None else top_p,
                    seed=None if seed is None else (seed + j) % SEED_SPACE,
                    stop=stops,
                )
                k = i * n + j
                jobs.append(_Job(k, greq, c, tickets[k], deadline))
        return jobs, sum(counts)

    def _starter(self, handle: ModelHandle, job: _Job) -> Callable[[], Generation]:
        def start() -> Generation:
            stream = handle.generate(job.take_ticket(), job.request, deadline=job.deadline)
            return Generation(
                stream,
                handle.model,
                index=job.index,
                max_tokens=job.max_tokens,
                prompt_tokens=job.prompt_tokens,
                stop=job.request.stop,
                on_tokens=job.on_tokens,
                model=handle.name,
            )

        return start

    def _respond(
        self,
        handle: ModelHandle,
        jobs: list[_Job],
        prompt_tokens: int,
        *,
        chat: bool,
        stream: bool,
        include_usage: bool,
    ) -> Response | StreamResponse | Coroutine[Any, Any, Response]:
        ident = _new_id("chatcmpl-" if chat else "cmpl-")
        created = int(time.time())
        if stream:
            chunks = Chunks(
                chat=chat, ident=ident, created=created, model=handle.name, usage=include_usage
            )
            cs = ChoiceStream(
                chunks,
                [self._starter(handle, job) for job in jobs],
                prompt_tokens=prompt_tokens,
                include_usage=include_usage,
                unstarted=[job.release for job in jobs],
            )
            return StreamResponse(cs, framing="sse")
        return self._whole(handle, jobs, prompt_tokens, chat=chat, ident=ident, created=created)

    async def _whole(
        self,
        handle: ModelHandle,
        jobs: list[_Job],
        prompt_tokens: int,
        *,
        chat: bool,
        ident: str,
        created: int,
    ) -> Response:
        # No await inside an ``except`` or ``finally`` here, and no ``async with``:
        # compiled code must not suspend in a handler (docs/architecture.md, "The
        # compiled build").
        async def one(job: _Job) -> tuple[str, str, int]:
            gen = self._starter(handle, job)()
            failure: BaseException | None = None
            try:
                async for _ in gen:
                    # Then what the model has ready, a batch per call (a sync inline
                    # model's generator makes it in the call): not one await per token.
                    # The loop gets a turn between full batches, as a pulled channel's
                    # consumer gives it (PULL_YIELD_EVERY).
                    while len(gen.take_ready(PULL_YIELD_EVERY)) == PULL_YIELD_EVERY:
                        await asyncio.sleep(0)
            except BaseException as exc:
                failure = exc
            await gen.aclose()
            if failure is not None:
                raise failure
            reason, tokens = gen.finish()
            return gen.text(), reason, tokens

        try:
            if len(jobs) == 1:
                results = [await one(jobs[0])]
            else:
                results = await _all_or_none([one(job) for job in jobs])
        finally:
            for job in jobs:
                job.release()
        completion_tokens = sum(r[2] for r in results)
        usage = s.Usage(prompt_tokens, completion_tokens, prompt_tokens + completion_tokens)
        if chat:
            choices = [
                s.ChatChoice(job.index, s.ChatMessage("assistant", text), None, reason)
                for job, (text, reason, _) in zip(jobs, results, strict=True)
            ]
            return _json(
                s.ChatCompletion(ident, "chat.completion", created, handle.name, choices, usage)
            )
        texts = [
            s.CompletionChoice(text, job.index, None, reason)
            for job, (text, reason, _) in zip(jobs, results, strict=True)
        ]
        return _json(s.Completion(ident, "text_completion", created, handle.name, texts, usage))

    def _engine_model(
        self, req: Request, *, kind: Literal["chat", "completions", "responses", "embeddings"]
    ) -> HandlerResult | None:
        """The answer of an engine-backed (``llamacpp``) model, or None for other models:
        the body goes to the engine undecoded (``app/engine_relay.py``)."""
        found = engine_for_request(self.engine, req)
        if found is None:
            return None
        relay, handle = found
        ticket = handle.admit()  # Overloaded: 429 with Retry-After
        # The engine's own timeout, capped by the model's limit (--request-timeout or its
        # deadline_s); the relay shortens it to the client's (the SDK headers).
        limit = min(relay.model.timeout, handle.spec.deadline_s)
        deadline = asyncio.get_running_loop().time() + limit
        try:
            if kind == "chat":
                return relay.chat(req, ticket, deadline, self.limits)
            if kind == "responses":
                return relay.responses(req, ticket, deadline, self.limits)
            if kind == "embeddings":
                return relay.embeddings(req, ticket, deadline, self.limits)
            return relay.completions(req, ticket, deadline, self.limits)
        except BaseException:
            release_ticket(ticket)
            raise

    # -- chat --------------------------------------------------------------------------
    def chat(self, req: Request) -> HandlerResult:
        relay = relay_for_request(self.engine, req)  # a remote model: relay, undecoded
        if relay is not None:
            return relay.forward(req, "/chat/completions")
        engine = self._engine_model(req, kind="chat")  # a llamacpp model: its engine
        if engine is not None:
            return engine
        body = s.decode(s.chat_decoder, req.body)
        check_count(len(body.messages), self.limits.messages, "messages", "messages")
        refuse_unsupported(body, chat=True)
        handle = self._handle(body.model, "generate")
        messages = [
            {"role": _ROLES.get(m.role, m.role), "content": _content(m, i)}
            for i, m in enumerate(body.messages)
        ]
        prompt = handle.model.chat_template(messages)
        max_tokens = (
            body.max_completion_tokens
            if body.max_completion_tokens is not None
            else body.max_tokens
        )
        return self._generate(handle, req, body, [prompt], max_tokens, chat=True, edge=req.edge)

    # -- completions -------------------------------------------------------------------
    def completions(self, req: Request) -> HandlerResult:
        relay = relay_for_request(self.engine, req)  # a remote model: relay, undecoded
        if relay is not None:
            return relay.forward(req, "/completions")
        engine = self._engine_model(req, kind="completions")
        if engine is not None:
            return engine
        body = s.decode(s.completion_decoder, req.body)
        refuse_unsupported(body, chat=False)
        for name, bad in (
            ("logprobs", body.logprobs is not None),
            ("echo", bool(body.echo)),
            ("best_of", body.best_of is not None and body.best_of > 1),
            ("suffix", body.suffix is not None),
        ):
            if bad:
                raise RequestError(f"'{name}' is not supported by this server", param=name)
        if isinstance(body.prompt, list):
            check_count(len(body.prompt), self.limits.prompts, "prompt", "prompts")
        prompts = _texts(body.prompt, "prompt")
        handle = self._handle(body.model, "generate")
        return self._generate(
            handle, req, body, prompts, body.max_tokens, chat=False, edge=req.edge
        )

    def _generate(
        self,
        handle: ModelHandle,
        req: Request,
        body: s.ChatCompletionRequest | s.CompletionRequest,
        prompts: list[str],
        max_tokens: int | None,
        *,
        chat: bool,
        edge: EdgeContext | None = None,
    ) -> HandlerResult:
        """Chat and completions alike: one job per prompt and choice, then the answer.
        ``edge`` counts the tokens against the API key's quota as they are produced."""
        jobs, prompt_tokens = self._jobs(
            handle,
            prompts,
            body.n or 1,
            max_tokens=max_tokens,
            stop=body.stop,
            temperature=body.temperature,
            top_p=body.top_p,
            seed=body.seed,
            deadline=handle.deadline(openai_timeout(req, stream=bool(body.stream))),
            max_tokens_param=(
                "max_completion_tokens"
                if isinstance(body, s.ChatCompletionRequest)
                and body.max_completion_tokens is not None
                else "max_tokens"
            ),
        )
        if edge is not None:
            edge.model = handle.name
            edge.count_tokens(prompt_tokens)
            for job in jobs:
                job.on_tokens = edge.count_tokens
                if edge.trace is not None:  # each generation's queue wait, traced
                    job.watch(edge.trace.queue_watch())
        include_usage = bool(body.stream_options and body.stream_options.include_usage)
        return self._respond(
            handle,
            jobs,
            prompt_tokens,
            chat=chat,
            stream=bool(body.stream),
            include_usage=include_usage,
        )

    # -- responses ----------------------------------------------------------------------
    def responses(self, req: Request) -> HandlerResult:
        """The Responses API (stateless): relayed to a remote model's upstream, served by
        a ``llamacpp`` model's engine (``app/engine_responses.py``); any other model
        gets a 400 (``unsupported_capability``) pointing to chat completions."""
        relay = relay_for_request(self.engine, req)
        if relay is not None:
            return relay.forward(req, "/responses")
        engine = self._engine_model(req, kind="responses")
        if engine is not None:
            return engine
        body = s.decode(s.model_only_decoder, req.body)
        handle = self._model(body.model, "model")
        raise CapabilityError(
            f"model {handle.name!r} does not serve the Responses API; "
            "use /v1/chat/completions (or a llamacpp model)",
            param="model",
        )

    # -- embeddings ---------------------------------------------------------------------
    def embeddings(self, req: Request) -> HandlerResult:
        relay = relay_for_request(self.engine, req)
        if relay is not None:
            return relay.forward(req, "/embeddings")
        engine = self._engine_model(req, kind="embeddings")  # a llamacpp model: its engine
        if engine is not None:
            return engine
        body = s.decode(s.embedding_decoder, req.body)
        if isinstance(body.input, list):
            check_count(len(body.input), self.limits.embedding_inputs, "input", "inputs")
        texts = _texts(body.input, "input")
        handle = self._handle(body.model, "embed")
        deadline = handle.deadline(openai_timeout(req))
        req.admit(handle)  # the request owns the ticket until the engine takes it
        if req.edge is not None:
            req.edge.model = handle.name
        return self._embed(req, texts, body, deadline)

    async def _embed(
        self, req: Request, texts: list[str], body: s.EmbeddingRequest, deadline: float
    ) -> Response:
        handle = req.handle
        vecs = await handle.embed(req.take_ticket(), texts, deadline=deadline)
        if body.dimensions is not None and body.dimensions != vecs.shape[1]:
            raise RequestError(
                f"model {handle.name!r} returns {vecs.shape[1]}-dimensional embeddings and "
                "cannot shorten them; omit 'dimensions' or pass its native size",
                param="dimensions",
            )
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
        return _json(s.EmbeddingList("list", data, handle.name, usage))


# The "developer" role replaced "system" in newer OpenAI models; templates know "system".
_ROLES = {"developer": "system"}


def _content(m: s.Message, i: int) -> str:
    content = m.content
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    texts: list[str] = []
    for j, part in enumerate(content):
        if part.type != "text" or part.text is None:
            raise RequestError(
                'only text content parts ({"type": "text", "text": ...}) are supported',
                param=f"messages[{i}].content[{j}]",
            )
        texts.append(part.text)
    # Text parts are joined with newlines (as vLLM does) into one message text.
    return "\n".join(texts)


def _texts(value: str | list[Any], param: str) -> list[str]:
    if isinstance(value, str):
        return [value]
    if all(isinstance(v, str) for v in value):
        return list(value)
    raise RequestError(
        f"token-array {param}s are not supported by this server; send text", param=param
    )
