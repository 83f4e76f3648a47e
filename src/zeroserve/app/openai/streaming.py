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

from msgspec import UNSET

from .generation import Generation
from .schemas import (
    ChatCompletionChunk,
    ChunkChoice,
    Completion,
    CompletionChoice,
    Delta,
    Usage,
    encoder,
)

DONE = b"[DONE]"
# Stands for the text while a content chunk's template is made (any string works; a
# control character keeps it from occurring in an id or a model name by chance).
_MARKER = "\x00text\x00"

Starter = Callable[[], Generation]


class Chunks:
    """Encodes the chunks of one stream (same id/created/model on every chunk)."""

    __slots__ = ("_templates", "chat", "created", "id", "model", "usage_default")

    def __init__(self, *, chat: bool, ident: str, created: int, model: str, usage: bool) -> None:
        self.chat = chat
        self.id = ident
        self.created = created
        self.model = model
        self.usage_default: Any = None if usage else UNSET
        # Per choice index: the content chunk's bytes before and after its text.
        self._templates: dict[int, tuple[bytes, bytes] | None] = {}

    def _chat(self, choices: list[ChunkChoice], usage: Any) -> bytes:
        return encoder.encode(
            ChatCompletionChunk(
                self.id, "chat.completion.chunk", self.created, self.model, choices, usage
            )
        )

    def _text(self, choices: list[CompletionChoice], usage: Any) -> bytes:
        return encoder.encode(
            Completion(self.id, "text_completion", self.created, self.model, choices, usage)
        )

    def role(self, index: int) -> bytes:
        delta = Delta(role="assistant", content="")
        return self._chat([ChunkChoice(index, delta, None, None)], self.usage_default)

    def content(self, index: int, text: str) -> bytes:
        """One content chunk: the encoded text between the bytes every content chunk of
        this choice shares (found once by encoding a chunk around a marker), so a token
        costs one string encode instead of building and encoding four structs."""
        templates = self._templates
        if index in templates:
            template = templates[index]
        else:
            template = templates[index] = self._template(index)
        if template is not None:
            return template[0] + encoder.encode(text) + template[1]
        return self._content(index, text)

    def _template(self, index: int) -> tuple[bytes, bytes] | None:
        marked = self._content(index, _MARKER)
        mark = encoder.encode(_MARKER)
        if marked.count(mark) != 1:  # the marker also in the id or model name: no template
            return None
        before, _, after = marked.partition(mark)
        return before, after

    def _content(self, index: int, text: str) -> bytes:
        if self.chat:
            return self._chat(
                [ChunkChoice(index, Delta(content=text), None, None)], self.usage_default
            )
        return self._text([CompletionChoice(text, index, None, None)], self.usage_default)

    def finish(self, index: int, reason: str) -> bytes:
        if self.chat:
            return self._chat([ChunkChoice(index, Delta(), None, reason)], self.usage_default)
        return self._text([CompletionChoice("", index, None, reason)], self.usage_default)

    def usage(self, usage: Usage) -> bytes:
        return self._chat([], usage) if self.chat else self._text([], usage)


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
            return head + self._contents(live.index, texts)
        return self._contents(live.index, live.take_ready(max_items))

    def _contents(self, index: int, texts: list[str]) -> list[bytes]:
        content = self.chunks.content
        return [content(index, text) for text in texts]

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
