"""OpenAI SSE streams: chat completion chunks and text completion chunks.

Each yielded item is one encoded chunk (``bytes``) or a list of them; the server frames
every chunk as its own ``data: ...\\n\\n`` event and coalesces what is ready in the same
loop iteration into one ``writelines``. Each chunk is encoded exactly once by the shared
msgspec encoder; nothing joins the stream into a larger string.

The shape follows OpenAI's streams:

* every chunk carries the same ``id``, ``created`` and ``model``;
* chat: the first chunk of a choice has ``delta: {"role": "assistant", "content": ""}``,
  then one chunk per text piece with ``delta: {"content": ...}``, then one chunk with an
  empty delta and the ``finish_reason`` (the only chunk of that choice with one);
* completions: one chunk per text piece, then one with ``text: ""`` and the reason;
* with ``stream_options.include_usage`` every chunk has ``"usage": null`` and a last
  chunk with ``"choices": []`` carries the usage;
* then ``data: [DONE]``.

Choices (``n`` > 1, or several prompts) are generated one after another, each with its
own admission ticket taken up front; clients merge chunks by ``index``, so the order is
allowed by the protocol, and it keeps one request from occupying several model slots.

The first model piece is awaited before anything is yielded, so an error before the
first token (an unknown capability, a deadline, a model failure) still reaches the
client as a plain HTTP error status; later errors become a final SSE error event.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, Awaitable, Callable, Sequence
from typing import Any

from .chunks import Chunks
from .generation import Generation
from .schemas import Usage

DONE = b"[DONE]"
Starter = Callable[[], Generation]


class ChoiceStream:
    """The pieces of a streamed response (a :class:`~zeroserve.app.response.PieceStream`),
    plus the cleanup the server awaits at its end.

    ``starters`` start each choice's generation when its turn comes (the generation then
    owns that choice's ticket); ``unstarted`` release the tickets of choices that never
    started, called once by :meth:`aclose`.
    """

    def __init__(
        self,
        chunks: Chunks,
        starters: Sequence[Starter],
        *,
        prompt_tokens: int,
        include_usage: bool,
        unstarted: Sequence[Callable[[], None]],
    ) -> None:
        self.chunks = chunks
        self.starters = starters
        self.prompt_tokens = prompt_tokens
        self.include_usage = include_usage
        self.unstarted = unstarted
        self._live: Generation | None = None
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
        """Content chunks of the running choice that are ready now: the server writes them
        with the chunk it just got. Only content: role, finish and usage chunks come from
        ``__anext__``, in their order.

        Called before the stream is iterated (the server does, from the I/O callback that
        completed the request), it starts the first choice and, if its model has pieces
        ready, returns the opening chunks (role, then content): the stream's head and
        first event then leave without waiting for a task. ``__anext__`` goes on after
        them."""
        live = self._live
        if live is None:
            if self._begun or not self.starters:
                return []
            self._begun = True
            try:
                live = self._live = self.starters[0]()
            except Exception as exc:  # the starter released its ticket; see _start_error
                self._start_error = exc
                return []
            texts = live.take_ready(max_items)
            if not texts:
                return []  # ``_run`` awaits the first piece of the choice started here
            self._opened = True
            head = [self.chunks.role(live.index)] if self.chunks.chat else []
            return head + self.chunks.contents(live.index, texts)
        return self.chunks.contents(live.index, live.take_ready(max_items))

    async def _run(self) -> AsyncGenerator[Any]:
        chunks = self.chunks
        completion_tokens = 0
        last = len(self.starters) - 1
        if self._start_error is not None:
            raise self._start_error
        for i, start in enumerate(self.starters):
            # The first choice may have been started (and opened) by receive_batch_nowait.
            gen = self._live if i == 0 and self._live is not None else start()
            self._live = gen
            self._begun = True
            index = gen.index
            try:
                if not (i == 0 and self._opened):
                    first = await anext(gen, None)
                    out: list[bytes] = [chunks.role(index)] if chunks.chat else []
                    if first is not None:
                        out.append(chunks.content(index, first))
                    if out:
                        yield out
                async for piece in gen:
                    yield chunks.content(index, piece)
            finally:
                await gen.aclose()
                self._live = None
            reason, tokens = gen.finish()
            completion_tokens += tokens
            if i < last:
                yield chunks.finish(index, reason)
                continue
            tail = [chunks.finish(index, reason)]
            if self.include_usage:
                p = self.prompt_tokens
                tail.append(chunks.usage(Usage(p, completion_tokens, p + completion_tokens)))
            tail.append(DONE)
            yield tail

    async def aclose(self) -> None:
        """Stop everything: the piece iterator, a running generation, the tickets of
        choices that never started."""
        try:
            await self._gen.aclose()
            if self._live is not None:
                await self._live.aclose()
        finally:
            for release in self.unstarted:
                release()
