"""The in-process engine as an upstream: chat and completions for ``llamacpp`` models.

Strategy (docs/architecture.md, "The in-process engine")
--------------------------------------------------------
This is the gateway's undecoded relay with a function call in place of a socket. The
request body is checked once by the strict schemas (``EngineChatRequest``: unknown fields
get a 400 naming them), its ``model`` is rewritten by the gateway's scanner
(``relay._rewrite``) and the result goes to ``Server.handle_chat_completions`` as bytes.
The engine's chunks come back as bytes and go to the client as SSE events as they are;
zeroserve looks inside a chunk only where it must, once, with msgspec: the first chunk
(an engine error becomes a proper HTTP status), and the final one (``timings``: tokens,
prompt-cache hits). Forced tool calls are the exception: their chunks are rewritten into
OpenAI's ``tool_calls`` deltas (:mod:`.engine_tools`).

Threads and slots: the engine blocks the calling thread in C++ for the whole generation,
so each model has a pool of exactly ``parallel`` threads (one per engine slot) and a
semaphore of ``parallel`` slots. A request waits for a slot on the event loop, holding
only its admission ticket (the queue depth bounds how many wait: 429 beyond); it never
waits in a thread.

Backpressure: the engine does not pause a slot for a slow reader, so a stream's pending
chunks are bounded in bytes (``coalesce_cap_bytes``, the channels' coalesce cap): every
pending chunk goes out in one write when the client is ready (they coalesce into one
``writelines``), and past the cap the stream is aborted (``StreamAborted``) and its slot
freed. Cancellation: a client disconnect, the deadline or ``aclose()`` set a flag that
makes the engine callback return ``True``, which stops the slot at its next token. A
whole answer is asked of the engine as a stream too (its whole-answer callback would
come only at the end) and assembled by :mod:`.engine_answers`.

The same slots serve ``/v1/responses`` (translated to a chat completion by
:mod:`.engine_responses`, its chunks turned into Responses events by the plan it gives
``_Run``) and, for a model started with ``embedding=true``, ``/v1/embeddings``
(``Server.handle_embeddings``: bytes in, OpenAI's answer as bytes out, relayed as it is;
a call cannot be stopped, so its slot is held until the engine returns, and a request of
many inputs is embedded in bounded chunks, :mod:`.engine_embeddings`, stopped between
two by a disconnect or its deadline).

A chat with no system message gets the model's default system prompt (``system_prompt``
option), spliced into the body's ``messages`` at its byte offset (``value_spans``).

Limits checked before a slot is taken: the generic path's counts (``n``, stop strings,
``n`` x ``max_tokens`` within the output-token budget, app/limits.py), ``max_tokens``
beyond the slot's context, and a prompt too long for it (``context_length_exceeded``).
The prompt check is exact only when it has to be: a prompt whose UTF-8 bytes (an upper
bound of its tokens for byte-level BPE vocabularies) plus the template's overhead fit is
accepted at once; otherwise the engine's own tokenizer counts it, through the locked
side port.
"""

from __future__ import annotations

import asyncio
import base64
import threading
import weakref
from collections import deque
from collections.abc import AsyncGenerator, Callable, Coroutine
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import msgspec

from .. import metrics
from ..edge.tracing import RequestTrace
from ..errors import CapabilityError, DeadlineExceeded, RequestError, ZeroserveError
from ..models.llamacpp import LlamaCppModel
from ..runtime.channel import DEFAULT_COALESCE_CAP_BYTES, StreamAborted
from .deadlines import openai_timeout
from .engine_answers import Collected, collect, streamed, whole_answer
from .engine_embeddings import chunks as embedding_chunks
from .engine_embeddings import merge as merge_embeddings
from .engine_responses import ResponsesAnswer, decode_request, translate
from .engine_tools import (
    AutoTool,
    ForcedTool,
    GeneratedPieces,
    NativeTools,
    plan_tools,
    release_ticket,
)
from .limits import ApiLimits, check_count, check_output_tokens
from .openai import schemas as s
from .openai.telemetry import GenerationTimer
from .relay._rewrite import model_spans, value_spans
from .request import Request
from .response import JSON, Response, StreamResponse

# Tokens a chat template adds around each message (role markers, separators) and once
# per conversation (the assistant header, a default system prompt: SmolLM2's is 20
# tokens). Generous bounds: they only decide when the exact count is needed.
TEMPLATE_TOKENS_PER_MESSAGE = 8
TEMPLATE_TOKENS_FIXED = 64
# Seconds to get an exact token count from the engine's tokenizer (loopback, no model
# work: milliseconds; a second means the engine is wedged).
TOKENIZE_TIMEOUT_S = 5.0
# Largest side-port answer read (a token list of a whole context: ~8 bytes a token).
TOKENIZE_MAX_BYTES = 4 << 20

DONE = b"[DONE]"
_encode = msgspec.json.encode
_INDEX0 = b'"index":0'
_EMPTY_CHOICES = b'"choices":[]'
_ERROR_PREFIX = b'{"error"'
_TIMINGS = b'"timings"'
# Roles that make a conversation's system message (the model's default is not added).
_SYSTEM_ROLES = frozenset({"system", "developer"})


def splice(body: memoryview, edits: list[tuple[int, int, bytes]]) -> bytes:
    """``body`` with each ``(start, end, new)`` span replaced by ``new`` (spans apart)."""
    out: list[bytes | memoryview] = []
    pos = 0
    for start, end, new in sorted(edits, key=lambda e: e[0]):
        out += (body[pos:start], new)
        pos = end
    out.append(body[pos:])
    return b"".join(out)


# How an answer is made from the engine's chunks, when not relayed as they are.
Plan = ForcedTool | AutoTool | ResponsesAnswer


@dataclass(frozen=True, slots=True)
class EngineStatistics:
    slots: int  # engine slots (parallel sequences)
    active: int  # slots generating now
    queued: int  # requests admitted and waiting for a slot
    requests: int
    aborted: int  # streams stopped early (disconnect, deadline, slow reader)
    embedded_inputs: int  # embedding inputs the engine computed (whole chunks)


def _client_deadline(req: Request, deadline: float, *, stream: bool) -> float:
    """``deadline`` (loop time) shortened to the client's own timeout, the SDK headers
    the generic OpenAI path honours too (app/deadlines.py); known once the body says
    whether it streams."""
    client = openai_timeout(req, stream=stream)
    if client is None:
        return deadline
    return min(deadline, asyncio.get_running_loop().time() + client)


def _check_choices(
    n: int | None,
    stop: str | list[str] | None,
    limits: ApiLimits,
    max_tokens: int | None,
    max_tokens_param: str = "max_tokens",
) -> None:
    """The count limits of the generic path (app/limits.py), for the engine's requests:
    each choice is one engine request, so ``n`` bounds the work one body can start, and
    ``n`` x ``max_tokens`` the request's output-token budget."""
    check_count(n or 1, limits.n, "n", "choices")
    check_output_tokens(n or 1, max_tokens, limits, max_tokens_param)
    stops = [stop] if isinstance(stop, str) else (stop or [])
    check_count(len(stops), limits.stop, "stop", "stop sequences")


class EngineRelay:
    """Serves one ``llamacpp`` model's chat and completions through its engine."""

    def __init__(self, name: str, model: LlamaCppModel, *, byte_cap: int) -> None:
        self.name = name
        self.model = model
        self.byte_cap = byte_cap
        self.slots = model.parallel
        self.pool = ThreadPoolExecutor(max_workers=self.slots, thread_name_prefix=f"engine-{name}")
        self._free: asyncio.Semaphore | None = None
        self.active = 0
        self.queued = 0
        self.requests = 0
        self.aborted = 0
        self.embedded_inputs = 0

    def statistics(self) -> EngineStatistics:
        return EngineStatistics(
            self.slots, self.active, self.queued, self.requests, self.aborted, self.embedded_inputs
        )

    def close(self) -> None:
        self.pool.shutdown(wait=False, cancel_futures=True)

    # -- requests --------------------------------------------------------------------------
    def chat(
        self, req: Request, ticket: Any, deadline: float, limits: ApiLimits
    ) -> Coroutine[Any, Any, Response | StreamResponse]:
        """Check a chat request and start answering it (an awaitable of the response)."""
        body = s.decode(s.engine_chat_decoder, req.body)
        deadline = _client_deadline(req, deadline, stream=bool(body.stream))
        check_count(len(body.messages), limits.messages, "messages", "messages")
        max_tokens = (
            body.max_completion_tokens
            if body.max_completion_tokens is not None
            else body.max_tokens
        )
        param = "max_tokens" if body.max_completion_tokens is None else "max_completion_tokens"
        _check_choices(body.n, body.stop, limits, max_tokens, param)
        if body.top_logprobs and not body.logprobs:
            raise RequestError("top_logprobs needs logprobs: true", param="top_logprobs")
        planned = plan_tools(body, self.model)
        native = planned if isinstance(planned, NativeTools) else None
        plan = None if isinstance(planned, NativeTools) else planned
        texts = [_message_text(m) for m in body.messages]
        extra = len(bytes(body.tools)) if s.given(body.tools) else 0
        bound = sum(len(t.encode()) for t in texts) + extra
        bound += TEMPLATE_TOKENS_FIXED + TEMPLATE_TOKENS_PER_MESSAGE * len(texts)
        system = None
        if plan is None and not any(m.role in _SYSTEM_ROLES for m in body.messages):
            system = self.model.system_prompt  # the model's default (None: the template's)
        if system is not None:
            bound += len(system.encode()) + TEMPLATE_TOKENS_PER_MESSAGE
        payload = plan.body if plan is not None else self._payload(req.body, system, native)
        n = body.n or 1
        return self._run(
            req,
            ticket,
            deadline,
            payload,
            chat=True,
            stream=bool(body.stream),
            n=n,
            seed=body.seed,
            max_tokens=max_tokens,
            bound=bound,
            messages=body.messages,
            prompt=None,
            plan=plan,
            error_param="tools"
            if plan is not None
            else "response_format"
            if s.given(body.response_format)
            else None,
        )

    def completions(
        self, req: Request, ticket: Any, deadline: float, limits: ApiLimits
    ) -> Coroutine[Any, Any, Response | StreamResponse]:
        body = s.decode(s.engine_completion_decoder, req.body)
        deadline = _client_deadline(req, deadline, stream=bool(body.stream))
        _check_choices(body.n, body.stop, limits, body.max_tokens)
        for name, bad in (
            ("echo", bool(body.echo)),
            ("best_of", body.best_of is not None and body.best_of > 1),
            ("suffix", body.suffix is not None),
        ):
            if bad:
                raise RequestError(f"'{name}' is not supported by this model", param=name)
        if not isinstance(body.prompt, str):
            raise RequestError(
                "this model takes one text prompt per request; send a string", param="prompt"
            )
        bound = len(body.prompt.encode()) + TEMPLATE_TOKENS_FIXED
        return self._run(
            req,
            ticket,
            deadline,
            self._payload(req.body),
            chat=False,
            stream=bool(body.stream),
            n=body.n or 1,
            seed=body.seed,
            max_tokens=body.max_tokens,
            bound=bound,
            messages=None,
            prompt=body.prompt,
            plan=None,
            error_param=None,
        )

    def responses(
        self, req: Request, ticket: Any, deadline: float, limits: ApiLimits
    ) -> Coroutine[Any, Any, Response | StreamResponse]:
        """A Responses API request (``app/engine_responses.py``): translated to a chat
        completion, answered in the Responses shapes."""
        body = decode_request(req.body)
        deadline = _client_deadline(req, deadline, stream=bool(body.stream))
        if not isinstance(body.input, str):
            check_count(len(body.input), limits.messages, "input", "input items")
        if body.tools is not None:
            check_count(len(body.tools), limits.tools, "tools", "tools")
        check_output_tokens(1, body.max_output_tokens, limits, "max_output_tokens")
        t = translate(body, self.model.alias, self.model.system_prompt, self.model)
        metrics.count_copy("engine_body", len(t.body))
        bound = t.bound + TEMPLATE_TOKENS_FIXED + TEMPLATE_TOKENS_PER_MESSAGE * len(t.messages)
        return self._run(
            req,
            ticket,
            deadline,
            t.body,
            chat=True,
            stream=bool(body.stream),
            n=1,
            seed=None,
            max_tokens=body.max_output_tokens,
            bound=bound,
            messages=t.messages,
            prompt=None,
            plan=ResponsesAnswer(body, t),
            error_param=t.error_param,
            names=("max_output_tokens", "input"),
        )

    def embeddings(
        self, req: Request, ticket: Any, deadline: float, limits: ApiLimits
    ) -> Coroutine[Any, Any, Response]:
        """``/v1/embeddings`` from the engine (a model started with ``embedding=true``):
        the body goes to ``Server.handle_embeddings`` as bytes and its answer, already
        OpenAI's shape, comes back as it is."""
        body = s.decode(s.engine_embedding_decoder, req.body)
        deadline = _client_deadline(req, deadline, stream=False)
        if not self.model.embedding:
            raise CapabilityError(
                f"model {self.name!r} was started without embeddings; "
                "serve it with the option embedding=true",
                param="model",
            )
        if isinstance(body.input, list):
            check_count(len(body.input), limits.embedding_inputs, "input", "inputs")
        parts = embedding_chunks(body, self.model.alias)
        if parts is None:  # one chunk: the body as it came
            n = 1 if isinstance(body.input, str) else len(body.input)
            parts = [(n, self._payload(req.body))]
        else:
            for _, payload in parts:
                metrics.count_copy("engine_body", len(payload))
        return self._embed(req, parts, ticket, deadline, body.dimensions)

    async def _embed(
        self,
        req: Request,
        parts: list[tuple[int, bytes]],
        ticket: Any,
        deadline: float,
        dimensions: int | None,
    ) -> Response:
        """Embed ``parts`` (each an engine body and its count of inputs) one after
        another in one slot; a disconnect (the task cancelled) or the deadline stops
        the request between two, once the engine call running returns."""
        self.requests += 1
        loop = asyncio.get_running_loop()
        answers: list[bytes] = []
        try:
            await self.acquire(deadline, req.edge.trace if req.edge is not None else None)
            running: asyncio.Future[bytes] | None = None
            try:
                async with asyncio.timeout(max(deadline - loop.time(), 0.0)):
                    for count, payload in parts:
                        # An engine call cannot be stopped once it runs: it is shielded,
                        # and the slot is released when its thread returns.
                        running = loop.run_in_executor(self.pool, self._embed_call, payload)
                        running.add_done_callback(self._embedded(count))
                        answer = await asyncio.shield(running)
                        running = None
                        if answer.startswith(_ERROR_PREFIX):
                            break
                        answers.append(answer)
            except TimeoutError:
                raise DeadlineExceeded("the request's deadline passed during embedding") from None
            finally:
                if running is not None and not running.done():
                    running.add_done_callback(lambda _: self.release())
                else:
                    self.release()
        finally:
            release_ticket(ticket)
        if answer.startswith(_ERROR_PREFIX):
            err = s.engine_error_decoder.decode(answer).error
            status = err.code if 400 <= err.code < 600 else 500
            raise ZeroserveError(err.message or "the engine failed", status=status, code=err.type)
        answer = answers[0] if len(answers) == 1 else merge_embeddings(answers)
        if dimensions is not None:
            vectors = s.engine_embeddings_decoder.decode(answer).data
            native = _dimension(vectors[0].embedding) if vectors else dimensions
            if native != dimensions:
                raise RequestError(
                    f"model {self.name!r} returns {native}-dimensional embeddings and cannot "
                    "shorten them; omit 'dimensions' or pass its native size",
                    param="dimensions",
                )
        if req.edge is not None:  # an API key's token quota
            req.edge.model = self.name
            req.edge.count_tokens(s.engine_usage_decoder.decode(answer).usage.prompt_tokens)
        return Response(200, [answer], content_type=JSON)

    def _embedded(self, count: int) -> Callable[[asyncio.Future[bytes]], None]:
        """A done callback counting ``count`` inputs the engine computed (on the loop)."""

        def done(fut: asyncio.Future[bytes]) -> None:
            if not fut.cancelled() and fut.exception() is None:
                self.embedded_inputs += count

        return done

    def _embed_call(self, payload: bytes) -> bytes:
        try:
            return bytes(self.model.server.handle_embeddings(payload))
        except ValueError as exc:  # the engine refused the input before computing
            raise RequestError(f"the engine refused the input: {exc}", param="input") from None

    def _payload(
        self, body: memoryview, system: str | None = None, native: NativeTools | None = None
    ) -> bytes:
        """The body as the engine takes it: bytes, with ``model`` set to the alias and,
        given ``system``, a system message put first in ``messages``; given ``native``,
        ``tools`` are only the allowed ones and ``tool_choice`` is ``"auto"`` (spliced
        in: the rest of the body is not re-encoded)."""
        edits = [(a, b, _encode(self.model.alias)) for a, b in model_spans(body) or ()]
        if native is not None:
            for key, value in (("tools", native.tools_json()), ("tool_choice", b'"auto"')):
                edits += [(a, b, value) for a, b in value_spans(body, key) or ()]
        if system is not None:
            spans = value_spans(body, "messages")
            if spans:  # the schema decoded it: a non-empty array (the last one counts)
                at = spans[-1][0] + 1
                edits.append((at, at, _encode({"role": "system", "content": system}) + b","))
        data = splice(body, edits)
        metrics.count_copy("engine_body", len(data))
        return data

    async def _run(
        self,
        req: Request,
        ticket: Any,
        deadline: float,
        payload: bytes,
        *,
        chat: bool,
        stream: bool,
        n: int,
        seed: int | None,
        max_tokens: int | None,
        bound: int,
        messages: Any,
        prompt: str | None,
        plan: Plan | None,
        error_param: str | None,
        names: tuple[str, str] | None = None,
    ) -> Response | StreamResponse:
        """``names``: the request's own names of the output limit and the prompt, for a
        ``context_length_exceeded`` (chat's and completions' by default)."""
        self.requests += 1
        if names is None:
            names = ("max_tokens", "messages" if messages is not None else "prompt")
        try:
            await self._check_context(max_tokens, bound, messages, prompt, deadline, names)
            if not stream:  # streamed from the engine all the same (app/engine_answers.py)
                payload = streamed(payload)
            edge = req.edge
            on_tokens = None
            trace = None
            if edge is not None:  # an API key's token quota: debited as each run ends
                edge.model = self.name
                on_tokens = edge.count_tokens
                trace = edge.trace
            if n > 1:
                return await run_choices(
                    self, payload, n, seed, chat, stream, deadline, ticket, on_tokens, trace
                )
            run = _Run(self, deadline, ticket, plan=plan, error_param=error_param)
            run.on_tokens, run.trace = on_tokens, trace
            return await run.start(payload, chat=chat, stream=stream)
        except BaseException:
            release_ticket(ticket)
            raise

    async def _check_context(
        self,
        max_tokens: int | None,
        bound: int,
        messages: Any,
        prompt: str | None,
        deadline: float,
        names: tuple[str, str],
    ) -> None:
        ctx = self.model.context_length
        want = max_tokens or 0
        if want >= ctx:
            raise RequestError(
                f"this model's maximum context length is {ctx} tokens; {names[0]} asks for {want}",
                param=names[0],
                code="context_length_exceeded",
            )
        if bound + want < ctx:
            return
        tokens = await self.count_prompt_tokens(messages, prompt, deadline)
        if tokens + want >= ctx:
            raise RequestError(
                f"this model's maximum context length is {ctx} tokens; the request has "
                f"{tokens} prompt tokens and asks for up to {want} more",
                param=names[1],
                code="context_length_exceeded",
            )

    async def count_prompt_tokens(self, messages: Any, prompt: str | None, deadline: float) -> int:
        """Exact prompt tokens, from the engine's template and tokenizer (side port)."""
        if prompt is None:
            rendered = await self._side(
                "/apply-template", msgspec.json.encode({"messages": messages}), deadline
            )
            prompt = str(msgspec.json.decode(rendered).get("prompt", ""))
        answer = await self._side(
            "/tokenize", msgspec.json.encode({"content": prompt, "add_special": True}), deadline
        )
        return len(msgspec.json.decode(answer).get("tokens", ()))

    async def _side(self, path: str, body: bytes, deadline: float) -> bytes:
        """POST ``body`` to the engine's locked side port (loopback, with its key)."""
        host, _, port = self.model.side_address.removeprefix("http://").rpartition(":")
        loop = asyncio.get_running_loop()
        timeout = max(min(TOKENIZE_TIMEOUT_S, deadline - loop.time()), 0.001)
        head = (
            f"POST {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n"
            f"Authorization: Bearer {self.model._side_key}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
        ).encode("latin-1")
        try:
            async with asyncio.timeout(timeout):
                reader, writer = await asyncio.open_connection(host, int(port))
                try:
                    writer.writelines([head, body])
                    data = await reader.read(TOKENIZE_MAX_BYTES)
                    while chunk := await reader.read(TOKENIZE_MAX_BYTES):
                        data += chunk
                finally:
                    writer.close()
        except TimeoutError:
            raise DeadlineExceeded("counting the prompt's tokens took too long") from None
        status_line, _, rest = data.partition(b"\r\n")
        _, _, payload = rest.partition(b"\r\n\r\n")
        if b" 200 " in status_line + b" ":
            return payload
        if b" 4" in status_line:  # the engine refused the conversation itself: the client's
            raise RequestError(  # fault (e.g. two assistant messages at the end), not ours
                f"the model's chat template refused the request: {_engine_message(payload)}",
                param="messages" if path == "/apply-template" else "prompt",
            )
        raise ZeroserveError("the engine could not count the prompt's tokens")

    # -- slots -----------------------------------------------------------------------------
    async def acquire(self, deadline: float, trace: RequestTrace | None = None) -> None:
        """Wait for a free engine slot (on the loop; never in a thread). ``trace``: the
        wait is the request's ``queue`` span (one per engine request, so per choice)."""
        if self._free is None:
            self._free = asyncio.Semaphore(self.slots)
        loop = asyncio.get_running_loop()
        watch = trace.queue_watch() if trace is not None else None
        if watch is not None:
            watch.queued()
        self.queued += 1
        try:
            async with asyncio.timeout(max(deadline - loop.time(), 0.0)):
                await self._free.acquire()
        except TimeoutError:
            raise DeadlineExceeded(
                "the request's deadline passed while it waited for a slot"
            ) from None
        finally:
            self.queued -= 1
        self.active += 1
        if watch is not None:
            watch.started()

    def release(self) -> None:
        self.active -= 1
        assert self._free is not None
        self._free.release()


class _Run:
    """One engine call: a pool thread runs it; the loop consumes its chunks.

    Thread side: :meth:`callback` (the engine's) appends chunks under ``_lock`` and wakes
    the loop only when the consumer is waiting. Loop side: ``__anext__`` and
    :meth:`receive_batch_nowait` take them. ``cancelled`` is read by the callback: once it
    is set, the callback returns ``True`` and the engine stops the slot.
    """

    def __init__(
        self,
        relay: EngineRelay,
        deadline: float,
        ticket: Any,
        *,
        plan: Plan | None = None,
        error_param: str | None = None,
    ) -> None:
        self.relay = relay
        self.deadline = deadline
        self.ticket = ticket
        self.plan = plan
        self.error_param = error_param
        self.loop = asyncio.get_running_loop()
        self._lock = threading.Lock()
        self._pending: deque[bytes] = deque()
        self._pending_bytes = 0
        self.peak_pending_bytes = 0
        self._waiter: asyncio.Future[None] | None = None
        self._waiting = False
        self._done = False
        self._error: BaseException | None = None
        self.cancelled = False
        self.complete = False  # the whole answer reached the consumer
        self._closed = False
        self._slot = False
        self._timer: asyncio.TimerHandle | None = None
        self.timer = GenerationTimer(relay.name)
        self.on_tokens: Callable[[int], None] | None = None  # the edge's token count
        self.trace: RequestTrace | None = None  # the request's spans (its queue wait)
        # Whether ``on_tokens`` counts the prompt too (once per request: the first of
        # ``n`` choices, as the answer's ``usage`` counts it).
        self.count_prompt = True
        self.timings: s.EngineTimings | None = None
        self._thread_done: asyncio.Future[None] | None = None

    @property
    def model(self) -> str:
        """The served model's name (what responses carry)."""
        return self.relay.name

    # -- thread side -----------------------------------------------------------------------
    def callback(self, chunk: bytes) -> bool:
        if self.cancelled:
            return True
        self.timer.token()
        with self._lock:
            self._pending.append(chunk)
            self._pending_bytes += len(chunk)
            if self._pending_bytes > self.peak_pending_bytes:
                self.peak_pending_bytes = self._pending_bytes
            over = self._pending_bytes > self.relay.byte_cap
            wake, self._waiting = self._waiting, False
        if over:
            self.cancelled = True
            self.loop.call_soon_threadsafe(
                self._fail,
                StreamAborted(
                    f"stream aborted: the client fell more than {self.relay.byte_cap} bytes behind"
                ),
            )
            return True
        if wake:
            self.loop.call_soon_threadsafe(self._wake)
        return False

    def _call(self, payload: bytes, chat: bool) -> None:
        server = self.relay.model.server
        try:
            if chat:
                server.handle_chat_completions(payload, self.callback)
            else:
                server.handle_completions(payload, self.callback)
        except BaseException as exc:
            error: BaseException = exc
            if isinstance(exc, ValueError):
                # The engine refused the request before generating (a grammar it cannot
                # build from the schema, a template error): the client's fault, named by
                # what the grammar came from (the schema, or the tools' parameters).
                error = RequestError(
                    f"the engine refused the request: {exc}", param=self.error_param
                )
            with self._lock:
                self._error = error
        finally:
            with self._lock:
                self._done = True
                wake, self._waiting = self._waiting, False
            if wake:
                self.loop.call_soon_threadsafe(self._wake)

    # -- loop side -------------------------------------------------------------------------
    async def start(self, payload: bytes, *, chat: bool, stream: bool) -> Response | StreamResponse:
        """Answer with the engine's chunks: relayed (a stream), made by the plan, or
        assembled into one whole answer (``payload`` then asks the engine for a stream:
        ``engine_answers.streamed``)."""
        first = await self.begin(payload, chat=chat)
        if self.plan is not None:
            return await self.plan.respond(self, first, chat=chat, stream=stream)
        if not stream:
            answer = await collect(self, first)
            return Response(200, [whole_answer([answer], self.model, chat=chat)], content_type=JSON)
        return StreamResponse(_Pieces(self, first), framing="sse")

    async def begin(self, payload: bytes, *, chat: bool) -> bytes:
        """Take a slot, start the engine call in a pool thread and return its first
        chunk (checked); on any failure the call is closed."""
        relay = self.relay
        await relay.acquire(self.deadline, self.trace)
        self._slot = True
        self._timer = self.loop.call_at(self.deadline, self._expire)
        fut = self.loop.run_in_executor(relay.pool, self._call, payload, chat)
        self._thread_done = asyncio.ensure_future(fut)
        self._thread_done.add_done_callback(self._thread_finished)
        try:
            first = await self.next_chunk()
            if first is None:
                raise ZeroserveError("the engine returned no answer")
            return self.check(first)
        except BaseException:
            self.close()
            raise

    def check(self, chunk: bytes) -> bytes:
        """Raise the engine's error chunk as a zeroserve error; read the final chunk's
        timings. Each chunk is looked at here only if it can be one of those two."""
        if chunk.startswith(_ERROR_PREFIX):
            err = s.engine_error_decoder.decode(chunk).error
            if err.type == "exceed_context_size_error":
                raise RequestError(
                    "the request exceeds this model's context length",
                    param="messages",
                    code="context_length_exceeded",
                )
            status = err.code if 400 <= err.code < 600 else 500
            raise ZeroserveError(err.message or "the engine failed", status=status, code=err.type)
        if _TIMINGS in chunk and self.timings is None:
            self.timings = s.engine_chunk_decoder.decode(chunk).timings
        return chunk

    async def next_chunk(self) -> bytes | None:
        while True:
            with self._lock:
                if self._pending:
                    chunk = self._pending.popleft()
                    self._pending_bytes -= len(chunk)
                    return chunk
                if self._error is not None:
                    raise self._error
                if self._done:
                    self.complete = True
                    return None
                self._waiting = True
                waiter = self._waiter = self.loop.create_future()
            try:
                await waiter
            finally:
                self._waiter = None

    def take_ready(self, max_items: int) -> list[bytes]:
        """Chunks here now, up to ``max_items``, stopping before an error chunk or the
        final one (with ``timings``): those go through ``next_chunk`` and ``check``."""
        out: list[bytes] = []
        with self._lock:
            pending = self._pending
            while pending and len(out) < max_items:
                chunk = pending[0]
                if chunk.startswith(_ERROR_PREFIX) or _TIMINGS in chunk:
                    break
                out.append(pending.popleft())
                self._pending_bytes -= len(chunk)
        return out

    def _wake(self) -> None:
        w = self._waiter
        if w is not None and not w.done():
            w.set_result(None)

    def _fail(self, exc: BaseException) -> None:
        with self._lock:
            self._pending.clear()
            self._pending_bytes = 0
            if self._error is None:
                self._error = exc
        self._wake()

    def _expire(self) -> None:
        self.cancelled = True
        self._fail(DeadlineExceeded("the request's deadline passed during generation"))

    def _thread_finished(self, fut: asyncio.Future[None]) -> None:
        if self._slot:
            self._slot = False
            self.relay.release()

    def close(self) -> None:
        """The response is over (complete, failed or abandoned): stop the engine at its
        next token if it is still generating; the slot frees when its thread returns."""
        if self._closed:
            return
        self._closed = True
        with self._lock:
            running = not self._done
        if running:
            self.cancelled = True
            if not self.complete:
                self.relay.aborted += 1
        if self._timer is not None:
            self._timer.cancel()
        if self._thread_done is None and self._slot:
            self._slot = False
            self.relay.release()
        release_ticket(self.ticket)
        self.ticket = None
        timings = self.timings
        if self.on_tokens is not None:
            used = self.timer.count
            if timings is not None:
                used = timings.predicted_n
                if self.count_prompt:
                    used += timings.cache_n + timings.prompt_n
            self.on_tokens(used)
        if timings is None:
            self.timer.observe()
        else:
            self.timer.observe(
                timings.predicted_n,
                prompt_tokens=timings.cache_n + timings.prompt_n,
                cached_tokens=timings.cache_n,
            )


class _Pieces:
    """The SSE pieces of one streamed answer: the engine's chunks as they came."""

    __slots__ = ("_done", "_first", "run")

    def __init__(self, run: _Run, first: bytes) -> None:
        self.run = run
        self._first: bytes | None = first
        self._done = False

    def __aiter__(self) -> _Pieces:
        return self

    async def __anext__(self) -> bytes:
        first = self._first
        if first is not None:
            self._first = None
            return first
        if self._done:
            raise StopAsyncIteration
        chunk = await self.run.next_chunk()
        if chunk is None:
            self._done = True
            return DONE
        return self.run.check(chunk)

    def receive_batch_nowait(self, max_items: int) -> list[bytes]:
        """Chunks already here (one write with the chunk just taken). The final chunk
        (with ``timings``) is left for ``__anext__``, which reads it."""
        if self._first is not None or self._done:
            return []
        return self.run.take_ready(max_items)

    async def aclose(self) -> None:
        self.run.close()

    @property
    def finish_reason(self) -> str | None:
        return None  # the engine's chunks carry it; zeroserve does not re-read them


def _dimension(vector: list[float] | str) -> int:
    """Floats in one engine vector (a base64 one holds little-endian float32s)."""
    if isinstance(vector, str):
        return len(base64.b64decode(vector)) // 4
    return len(vector)


def _message_text(m: s.EngineMessage) -> str:
    content = m.content
    if content is None:
        text = ""
    elif isinstance(content, str):
        text = content
    else:
        text = "\n".join(p.text or "" for p in content)
    if m.tool_calls:
        text += "".join(c.function.name + c.function.arguments for c in m.tool_calls)
    return text


# -- n > 1 --------------------------------------------------------------------------------
def _choice_payloads(payload: bytes, n: int, seed: int | None) -> list[bytes]:
    body = msgspec.json.decode(payload)
    out = []
    for j in range(n):
        body["n"] = 1
        if seed is not None:
            body["seed"] = seed + j
        out.append(_encode(body))
    return out


async def run_choices(
    relay: EngineRelay,
    payload: bytes,
    n: int,
    seed: int | None,
    chat: bool,
    stream: bool,
    deadline: float,
    ticket: Any,
    on_tokens: Callable[[int], None] | None,
    trace: RequestTrace | None = None,
) -> Response | StreamResponse:
    """``n`` choices, one engine request each; ``on_tokens`` (the edge's token count) is
    given each run's tokens as it ends; each run's slot wait is a ``queue`` span of
    ``trace``."""
    payloads = _choice_payloads(payload, n, seed)
    if not stream:

        async def one(j: int, p: bytes) -> Collected:
            run = _Run(relay, deadline, None)
            run.on_tokens, run.count_prompt, run.trace = on_tokens, j == 0, trace
            return await collect(run, await run.begin(p, chat=chat))

        try:
            async with asyncio.TaskGroup() as tg:
                tasks = [tg.create_task(one(j, p)) for j, p in enumerate(payloads)]
        except ExceptionGroup as group:
            raise group.exceptions[0] from None
        finally:
            release_ticket(ticket)
        answers = [t.result() for t in tasks]
        body = whole_answer(answers, relay.name, chat=chat)
        return Response(200, [body], content_type=JSON)
    return StreamResponse(
        GeneratedPieces(
            _stream_choices(relay, payloads, chat, deadline, ticket, on_tokens, trace),
            lambda: release_ticket(ticket),
        ),
        framing="sse",
    )


async def _stream_choices(
    relay: EngineRelay,
    payloads: list[bytes],
    chat: bool,
    deadline: float,
    ticket: Any,
    on_tokens: Callable[[int], None] | None,
    trace: RequestTrace | None,
) -> AsyncGenerator[bytes, None]:
    prompt = completion = 0
    last_usage: Any = None
    try:
        for j, p in enumerate(payloads):
            run = _Run(relay, deadline, None)
            run.on_tokens, run.count_prompt, run.trace = on_tokens, j == 0, trace
            resp = await run.start(p, chat=chat, stream=True)
            assert isinstance(resp, StreamResponse)
            index = b'"index":%d' % j
            try:
                while True:
                    try:
                        chunk = await resp.pieces.__anext__()
                    except StopAsyncIteration:
                        break
                    if chunk == b"[DONE]":
                        break
                    if _EMPTY_CHOICES in chunk:  # the usage chunk: summed at the end
                        last_usage = msgspec.json.decode(chunk)
                        u = last_usage.get("usage") or {}
                        prompt = prompt or int(u.get("prompt_tokens", 0))
                        completion += int(u.get("completion_tokens", 0))
                        continue
                    yield chunk.replace(_INDEX0, index, 1) if j else chunk
            finally:
                run.close()
        if last_usage is not None:
            last_usage["usage"] = {
                "prompt_tokens": prompt,
                "completion_tokens": completion,
                "total_tokens": prompt + completion,
            }
            last_usage.pop("timings", None)
            yield _encode(last_usage)
        yield b"[DONE]"
    finally:
        release_ticket(ticket)


# -- discovery (as app.relay finds remote models) -----------------------------------------
_RELAYS: weakref.WeakKeyDictionary[LlamaCppModel, EngineRelay] = weakref.WeakKeyDictionary()


def engine_relay_for(
    handle: Any, *, byte_cap: int = DEFAULT_COALESCE_CAP_BYTES
) -> EngineRelay | None:
    """The engine relay of a model handle, or None unless it is a loaded ``llamacpp``
    model (one relay per model instance, made on first use)."""
    meta = handle.model
    if not isinstance(meta, LlamaCppModel) or meta.server is None:
        return None
    relay = _RELAYS.get(meta)
    if relay is None:
        relay = _RELAYS[meta] = EngineRelay(handle.name, meta, byte_cap=byte_cap)
    return relay


def engine_for_request(engine: Any, req: Request) -> tuple[EngineRelay, Any] | None:
    """``(relay, handle)`` when the JSON body's ``"model"`` names a ``llamacpp`` model;
    None otherwise (the caller's own decoding reports a bad body or an unknown model).
    Only the ``"model"`` string is decoded here."""
    if not engine_relays(engine):
        return None  # the common case: no engine model, no need to scan the body
    spans = model_spans(req.body)
    if not spans:
        return None
    start, end = spans[-1]
    try:
        name = msgspec.json.decode(req.body[start:end])
        handle = engine.model(name)
    except (msgspec.DecodeError, ZeroserveError, TypeError):
        return None
    relay = engine_relay_for(handle, byte_cap=engine.options.coalesce_cap_bytes)
    return None if relay is None else (relay, handle)


def engine_relays(engine: Any) -> dict[str, EngineRelay]:
    """The relays of every ``llamacpp`` model an engine serves (made now if need be)."""
    out: dict[str, EngineRelay] = {}
    for name in engine.names():
        relay = engine_relay_for(engine.model(name), byte_cap=engine.options.coalesce_cap_bytes)
        if relay is not None:
            out[name] = relay
    return out


def close_engine_relays(engine: Any) -> None:
    """Stop the engine threads of an engine's ``llamacpp`` models (at shutdown)."""
    for relay in engine_relays(engine).values():
        relay.close()
        _RELAYS.pop(relay.model, None)


def _snapshot() -> dict[str, EngineStatistics]:
    return {r.name: r.statistics() for r in list(_RELAYS.values())}


metrics.register_source("engine", _snapshot, counters=("embedded_inputs",))

__all__ = [
    "EngineRelay",
    "close_engine_relays",
    "engine_for_request",
    "engine_relay_for",
    "engine_relays",
]


# At most this much of an engine's refusal is repeated to the client (its messages are
# one short sentence; the bound keeps an echo of client input short too).
MAX_ENGINE_MESSAGE_CHARS = 200


class _EngineError(msgspec.Struct):
    message: str = ""


class _EngineRefusal(msgspec.Struct):
    error: _EngineError | str = ""


def _engine_message(payload: bytes) -> str:
    """The message of llama.cpp's ``{"error": {"message": ...}}`` answer, bounded."""
    try:
        err = msgspec.json.decode(payload, type=_EngineRefusal).error
    except (msgspec.DecodeError, msgspec.ValidationError):
        return "no reason given"
    text = err if isinstance(err, str) else err.message
    if len(text) > MAX_ENGINE_MESSAGE_CHARS:
        text = text[: MAX_ENGINE_MESSAGE_CHARS - 1] + "…"
    return text or "no reason given"
