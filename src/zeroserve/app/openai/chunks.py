"""The chunks of an OpenAI SSE stream, encoded (``ChoiceStream`` in ``streaming.py``
sends them). Its own module so that it is compiled with the hot path: a chunk is built
per streamed piece, and ``streaming.py`` holds an async generator, which mypyc does not
compile (docs/decisions/0007-compiled-build.md)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import msgspec
from msgspec import UNSET

from ..chat import DeltaPiece
from .schemas import (
    ChatCompletionChunk,
    ChunkChoice,
    Completion,
    CompletionChoice,
    Delta,
    ToolCallDelta,
    Usage,
    encoder,
)

# Stands for the text while a content chunk's template is made (any string works; a
# control character keeps it from occurring in an id or a model name by chance).
_MARKER = "\x00text\x00"


class Chunks:
    """Encodes the chunks of one stream (same id/created/model on every chunk)."""

    __slots__ = ("_templates", "chat", "continuous", "created", "id", "model", "usage_default")

    def __init__(
        self,
        *,
        chat: bool,
        ident: str,
        created: int,
        model: str,
        usage: bool,
        continuous: bool = False,
    ) -> None:
        self.chat = chat
        # Every chunk carries the usage so far (``usage_default``, set by the stream
        # before each chunk), so no chunk shares a template with another.
        self.continuous = continuous
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
        if self.continuous:
            return self._content(index, text)
        templates = self._templates
        if index in templates:
            template = templates[index]
        else:
            template = templates[index] = self._template(index)
        if template is not None:
            return template[0] + encoder.encode(text) + template[1]
        return self._content(index, text)

    def contents(self, index: int, pieces: Sequence[str | DeltaPiece]) -> list[bytes]:
        """The chunk of each piece, in order (a batch of ready pieces)."""
        return [self.piece(index, p) for p in pieces]

    def piece(self, index: int, piece: str | DeltaPiece) -> bytes:
        """The chunk of one piece: text (the common case) or a delta."""
        if isinstance(piece, str):
            return self.content(index, piece)
        return self.delta(index, piece)

    def opening(self, index: int, first: str | DeltaPiece | None) -> list[bytes]:
        """A choice's first chunks: chat's role, then its first piece; a tool call's first
        fragment goes in the role's own chunk (``content: null``), as OpenAI sends it."""
        if not self.chat:
            return [] if first is None else [self.piece(index, first)]
        if isinstance(first, DeltaPiece) and first.call is not None:
            return [self.delta(index, first, role=True)]
        head = [self.role(index)]
        if first is not None:
            head.append(self.piece(index, first))
        return head

    def delta(self, index: int, piece: DeltaPiece, *, role: bool = False) -> bytes:
        """The chunk of a piece that is more than text: text with its log probabilities,
        reasoning, a tool call's fragment (``role``: with the choice's role, and its
        ``content`` null unless the piece has text)."""
        logprobs = (
            msgspec.Raw(b'{"content":[' + b",".join(bytes(r) for r in piece.logprobs) + b"]}")
            if piece.logprobs is not None
            else None
        )
        if not self.chat:
            choice = CompletionChoice(piece.text or "", index, logprobs, None)
            return self._text([choice], self.usage_default)
        delta = Delta(role="assistant", content=None) if role else Delta()
        if piece.text is not None:
            delta.content = piece.text
        if piece.reasoning is not None:
            delta.reasoning_content = piece.reasoning
        call = piece.call
        if call is not None:
            function: dict[str, str] = {"arguments": call.arguments}
            if call.name is not None:
                function = {"name": call.name, "arguments": call.arguments}
            out = ToolCallDelta(call.index, function=function)
            if call.id is not None:
                out.id = call.id
                out.type = "function"
            delta.tool_calls = [out]
        return self._chat([ChunkChoice(index, delta, logprobs, None)], self.usage_default)

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
