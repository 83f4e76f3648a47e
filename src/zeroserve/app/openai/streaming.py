"""OpenAI SSE streams: chat completion chunks and text completion chunks.

Each yielded item is one encoded chunk (``bytes``) or a list of them; the server frames
every chunk as its own ``data: ...\\n\\n`` event and coalesces what is ready in the same
loop iteration into one ``writelines``. Each chunk is encoded exactly once by the shared
msgspec encoder; nothing joins the stream into a larger string.

The shape follows OpenAI's streams:

* every chunk carries the same ``id``, ``created`` and ``model``;
* chat: the first chunk of a choice has ``delta: {"role": "assistant", "content": ""}``,
  then one chunk per piece (``delta: {"content": ...}``, or a tool call's fragment,
  reasoning, log probabilities), then one chunk with an empty delta and the
  ``finish_reason`` (the only chunk of that choice with one);
* completions: one chunk per text piece, then one with ``text: ""`` and the reason;
* with ``stream_options.include_usage`` every chunk has ``"usage": null`` and a last
  chunk with ``"choices": []`` carries the usage; with ``continuous_usage_stats`` too
  (vLLM's), every chunk carries its choice's usage so far instead of ``null``;
* then ``data: [DONE]``.

Choices (``n`` > 1, or several prompts) are generated one after another (``app/chat/
choices.py``), each with its own admission ticket taken up front.

The first piece of the model is awaited before anything is yielded, so an error before
the first token (a deadline, a model failure, an engine's refusal) still reaches the
client as a plain HTTP error status; later errors become a final SSE error event.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, Awaitable
from typing import Any

from ..chat import Choices, Finish, Output
from .chunks import Chunks
from .schemas import PromptTokensDetails, Usage

DONE = b"[DONE]"


def usage(finishes: list[Finish], n: int) -> Usage:
    """The usage of an answer's choices: the prompt of each prompt once (its first
    choice's), the completions summed, the prompt cache's share when it reported one."""
    firsts = finishes[::n]
    prompt = sum(f.prompt_tokens for f in firsts)
    completion = sum(f.completion_tokens for f in finishes)
    out = Usage(prompt, completion, prompt + completion)
    if any(f.cached_tokens is not None for f in firsts):
        out.prompt_tokens_details = PromptTokensDetails(sum(f.cached_tokens or 0 for f in firsts))
    return out


class ChoiceStream:
    """The pieces of a streamed response (a :class:`~zeroserve.app.response.PieceStream`):
    its choices' outputs one after another, encoded as chunks. It owns ``choices`` (the
    tickets of those not started) and releases them once, in :meth:`aclose`."""

    def __init__(
        self,
        chunks: Chunks,
        choices: Choices,
        *,
        n: int,
        include_usage: bool,
        continuous: bool = False,
    ) -> None:
        self.chunks = chunks
        self.continuous = continuous
        self.choices = choices
        self.n = n
        self.include_usage = include_usage
        self._live: Output | None = None
        self._begun = False  # the first choice was started
        self._opened = False  # ... and its opening chunks returned by receive_batch_nowait
        # Why the first choice could not start in receive_batch_nowait (for example its
        # deadline had passed): raised by the first ``__anext__``, so the server answers it
        # as the error response it is, not from inside its I/O callback.
        self._start_error: Exception | None = None
        self._gen: AsyncGenerator[Any] = self._run()

    def __aiter__(self) -> ChoiceStream:
        return self

    def __anext__(self) -> Awaitable[Any]:
        return self._gen.__anext__()

    @property
    def finish_reason(self) -> str | None:
        return None  # each choice has its own, sent in its finish chunk

    def receive_batch_nowait(self, max_items: int) -> list[bytes]:
        """Chunks of the running choice's pieces that are ready now: the server writes
        them with the chunk it just got. Only pieces: role, finish and usage chunks come
        from ``__anext__``, in their order.

        Called before the stream is iterated (the server does, from the I/O callback that
        completed the request), it starts the first choice and, if its model has pieces
        ready, returns the opening chunks (role, then pieces): the stream's head and
        first event then leave without waiting for a task. ``__anext__`` goes on after
        them."""
        live = self._live
        if live is None:
            pending = self.choices.pending
            if self._begun or not pending:
                return []
            self._begun = True
            try:
                live = self._live = pending[0].start()
            except Exception as exc:  # the start released its ticket; see _start_error
                self._start_error = exc
                return []
            pieces = live.take_ready(max_items)
            if not pieces:
                return []  # ``_run`` awaits the first piece of the choice started here
            self._opened = True
            self._tell(live)
            opening = self.chunks.opening(live.index, pieces[0])
            return opening + self.chunks.contents(live.index, pieces[1:])
        pieces = live.take_ready(max_items)
        self._tell(live)
        return self.chunks.contents(live.index, pieces)

    def _tell(self, out: Output) -> None:
        """With a continuous usage, the usage the next chunks carry: ``out``'s so far."""
        if self.continuous:
            prompt, completion = out.tokens_so_far()
            self.chunks.usage_default = Usage(prompt, completion, prompt + completion)

    async def _run(self) -> AsyncGenerator[Any]:
        chunks = self.chunks
        pending = self.choices.pending
        finishes: list[Finish] = []
        last = len(pending) - 1
        if self._start_error is not None:
            raise self._start_error
        for i, p in enumerate(pending):
            # The first choice may have been started (and opened) by receive_batch_nowait.
            out = self._live if i == 0 and self._live is not None else p.start()
            self._live = out
            self._begun = True
            index = out.index
            try:
                if not (i == 0 and self._opened):
                    first = await anext(out, None)
                    self._tell(out)
                    head = chunks.opening(index, first)
                    if head:
                        yield head
                async for piece in out:
                    self._tell(out)
                    yield chunks.piece(index, piece)
            finally:
                await out.aclose()
                self._live = None
            finish = out.finish()
            finishes.append(finish)
            if self.continuous:
                chunks.usage_default = Usage(
                    finish.prompt_tokens,
                    finish.completion_tokens,
                    finish.prompt_tokens + finish.completion_tokens,
                )
            if i < last:
                yield chunks.finish(index, finish.reason)
                continue
            tail = [chunks.finish(index, finish.reason)]
            if self.include_usage:
                tail.append(chunks.usage(usage(finishes, self.n)))
            tail.append(DONE)
            yield tail

    async def aclose(self) -> None:
        """Stop everything: the piece iterator, a running choice, the tickets of choices
        that never started."""
        try:
            await self._gen.aclose()
            if self._live is not None:
                await self._live.aclose()
        finally:
            self.choices.release()
