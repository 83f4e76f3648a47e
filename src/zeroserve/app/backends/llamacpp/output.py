"""One choice of a llama.cpp answer: the engine's chunks, decoded once each, as pieces
(an :class:`~...chat.Output` over the runtime's :class:`~zeroserve.runtime.SlotStream`).

A chunk's text is a plain ``str`` piece; text with its log probabilities, reasoning
text and a native tool call's fragments are :class:`~...chat.Delta` pieces. An engine
error chunk (``{"error": ...}``) is raised as the HTTP error it maps to; a refusal the
engine raised before generating (a grammar it cannot build, a template error) is a 400
naming what it came from (``error_param``: the schema, the tools). The last chunk
carries the usage and ``timings`` (tokens, prompt-cache hits): the finish, the
generation metrics and an API key's token count come from it once the output closes.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable

from ....errors import RequestError, ZeroserveError
from ....runtime import SlotStream
from ...chat import CallDelta, DeltaPiece, Finish, Piece
from ...openai.telemetry import GenerationTimer
from . import wire

_ERROR_PREFIX = b'{"error"'


class EngineOutput:
    """One engine call's pieces."""

    __slots__ = (
        "_count_prompt",
        "_on_tokens",
        "_queue",
        "_reason",
        "_stop_word",
        "_stream",
        "_timings",
        "_usage",
        "error_param",
        "index",
        "timer",
    )

    def __init__(
        self,
        index: int,
        stream: SlotStream,
        model: str,
        *,
        error_param: str | None = None,
        on_tokens: Callable[[int], None] | None = None,
        count_prompt: bool = True,
    ) -> None:
        self.index = index
        self._stream = stream
        self.error_param = error_param
        self._queue: deque[Piece] = deque()
        self._reason: str | None = None
        self._stop_word: str | None = None  # the stop string that matched (verbose chunks)
        self._usage: wire.EngineUsage | None = None
        self._timings: wire.EngineTimings | None = None
        self.timer = GenerationTimer(model)
        # An API key's token count (the edge), told once at the end; the prompt counts
        # once per request (the first choice of each prompt), as ``usage`` counts it.
        self._on_tokens = on_tokens
        self._count_prompt = count_prompt

    def __aiter__(self) -> EngineOutput:
        return self

    async def __anext__(self) -> Piece:
        queue = self._queue
        while not queue:
            try:
                chunk = await self._stream.__anext__()
            except ValueError as exc:
                # The engine refused the request before generating: the client's fault.
                raise RequestError(
                    f"the engine refused the request: {exc}", param=self.error_param
                ) from None
            self._absorb(chunk)
        self.timer.token()
        return queue.popleft()

    def take_ready(self, max_items: int) -> list[Piece]:
        queue = self._queue
        if len(queue) < max_items:
            for chunk in self._stream.receive_batch_nowait(max_items - len(queue)):
                self._absorb(chunk)
        out: list[Piece] = []
        while queue and len(out) < max_items:
            out.append(queue.popleft())
        self.timer.tokens(len(out))
        return out

    def _absorb(self, chunk: bytes) -> None:
        if chunk.startswith(_ERROR_PREFIX):
            raise engine_error(chunk)
        data = wire.chunk_decoder.decode(chunk)
        if data.usage is not None:
            self._usage = data.usage
        if data.timings is not None:
            self._timings = data.timings
        verbose = data.verbose
        if verbose is not None and verbose.stop_type == "word":
            self._stop_word = verbose.stopping_word
        queue = self._queue
        for c in data.choices:
            logprobs = c.logprobs.content if c.logprobs is not None else None
            d = c.delta
            text = d.content if d is not None else c.text
            if logprobs is not None:
                queue.append(DeltaPiece(text, logprobs=logprobs))
            elif text:
                queue.append(text)
            if d is not None:
                if d.reasoning_content:
                    queue.append(DeltaPiece(reasoning=d.reasoning_content))
                for t in d.tool_calls or ():
                    f = t.function
                    name = f.name if f is not None else None
                    queue.append(
                        DeltaPiece(
                            call=CallDelta(
                                t.index,
                                (f.arguments or "") if f is not None else "",
                                id=t.id,
                                name=name or None,
                            )
                        )
                    )
            if c.finish_reason is not None:
                self._reason = c.finish_reason

    async def aclose(self) -> None:
        await self._stream.aclose()
        timings = self._timings
        if self._on_tokens is not None:
            on_tokens, self._on_tokens = self._on_tokens, None
            used = self.timer.count
            if timings is not None:
                used = timings.predicted_n
                if self._count_prompt:
                    used += timings.cache_n + timings.prompt_n
            on_tokens(used)
        if timings is None:
            self.timer.observe()
        else:
            self.timer.observe(
                timings.predicted_n,
                prompt_tokens=timings.cache_n + timings.prompt_n,
                cached_tokens=timings.cache_n,
            )

    def tokens_so_far(self) -> tuple[int, int]:
        """From the engine's latest timings (on every chunk when the request asked for
        ``timings_per_token``, as a continuous usage does), else its final usage."""
        u = self._usage
        if u is not None:
            return u.prompt_tokens, u.completion_tokens
        t = self._timings
        if t is None:
            return 0, 0
        return t.cache_n + t.prompt_n, t.predicted_n

    def finish(self) -> Finish:
        u = self._usage or wire.EngineUsage()
        details = u.prompt_tokens_details
        return Finish(
            self._reason or "stop",
            u.completion_tokens,
            u.prompt_tokens,
            details.cached_tokens if details is not None else None,
            self._stop_word,
        )


def engine_error(chunk: bytes) -> ZeroserveError:
    """The HTTP error an engine's ``{"error": ...}`` answer maps to."""
    err = wire.error_decoder.decode(chunk).error
    if err.type == "exceed_context_size_error":
        return RequestError(
            "the request exceeds this model's context length",
            param="messages",
            code="context_length_exceeded",
        )
    status = err.code if 400 <= err.code < 600 else 500
    return ZeroserveError(err.message or "the engine failed", status=status, code=err.type)
