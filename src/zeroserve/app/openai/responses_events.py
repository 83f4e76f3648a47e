"""A Responses API answer: the ``response`` object, and the stream's events in OpenAI's
exact order and format (``event: <type>`` and ``data: <json>``, ``sequence_number``
from 0), written from the pieces of one choice, whatever backend made them.

The stream: ``response.created``, ``response.in_progress``, then per output item
``response.output_item.added``; a message's ``response.content_part.added``, one
``response.output_text.delta`` per text piece, ``response.output_text.done``,
``response.content_part.done``; a call's ``response.function_call_arguments.delta`` per
fragment and ``...arguments.done``; ``response.output_item.done``; and at the end
``response.completed`` (``response.incomplete`` when ``max_output_tokens`` cut it). When
the answer may be a call (tools given, not ``none``), a message item opens only once the
answer turns out to be text. The first piece is awaited before the first event, so a
failure before it is still an HTTP status; a failure after it is an ``error`` event, and
the stream ends.
"""

from __future__ import annotations

import os
import time
from collections.abc import AsyncGenerator
from typing import Any, Literal

import msgspec

from ...errors import ZeroserveError
from ..chat import DeltaPiece, Finish, Output, Piece, QueuedChoice
from . import responses_schemas as r

Status = Literal["in_progress", "completed", "incomplete"]
_encode = msgspec.json.encode


class Answer:
    """One Responses answer: the whole object, or its events."""

    def __init__(
        self,
        req: r.ResponsesRequest,
        tools: list[r.FunctionToolIn],
        choice: Any,
        model: str,
    ) -> None:
        self.req = req
        self.choice = choice
        self.model = model
        self.tools = [
            r.FunctionToolOut(
                name=x.name,
                description=x.description,
                parameters=x.parameters if isinstance(x.parameters, msgspec.Raw) else None,
                strict=x.strict,
            )
            for x in tools
        ]
        # Whether the answer may be a call: then a message item opens only for text.
        self.may_call = bool(tools) and choice != "none"
        self.ident = "resp_" + os.urandom(24).hex()
        self.created = int(time.time())
        self.seq = 0
        # The stream's output items: those done, and the one open (if any).
        self.items: list[r.OutputItem] = []
        self.open: r.OutputMessage | r.FunctionCallOut | None = None
        self.parts: list[str] = []  # the open item's text or arguments

    # -- the object ------------------------------------------------------------------------
    def snapshot(
        self,
        status: Any,
        output: list[r.OutputItem],
        usage: r.ResponseUsage | None = None,
        incomplete: bool = False,
    ) -> r.ResponseObject:
        req = self.req
        fmt = req.text.format if req.text is not None else None
        fmt_out = (
            r.FormatOut(type="text")
            if fmt is None
            else r.FormatOut(
                type=fmt.type,
                name=fmt.name if fmt.name is not None else msgspec.UNSET,
                description=fmt.description if fmt.description is not None else msgspec.UNSET,
                schema=fmt.schema,
                strict=fmt.strict if fmt.strict is not None else msgspec.UNSET,
            )
        )
        return r.ResponseObject(
            id=self.ident,
            created_at=self.created,
            status=status,
            incomplete_details=r.IncompleteDetails(reason="max_output_tokens")
            if incomplete
            else None,
            instructions=req.instructions,
            max_output_tokens=req.max_output_tokens,
            max_tool_calls=req.max_tool_calls,
            model=self.model,
            output=output,
            parallel_tool_calls=req.parallel_tool_calls is not False,
            prompt_cache_key=req.prompt_cache_key,
            safety_identifier=req.safety_identifier,
            temperature=1.0 if req.temperature is None else req.temperature,
            text=r.TextOut(format=fmt_out),
            tool_choice=self.choice,
            tools=self.tools,
            top_p=1.0 if req.top_p is None else req.top_p,
            usage=usage,
            user=req.user,
            metadata=req.metadata or {},
        )

    @staticmethod
    def message(text: str, status: Status) -> r.OutputMessage:
        return r.OutputMessage(
            id="msg_" + os.urandom(24).hex(), status=status, content=[r.OutputText(text=text)]
        )

    @staticmethod
    def call(call_id: str, name: str, arguments: str, status: Status) -> r.FunctionCallOut:
        return r.FunctionCallOut(
            id="fc_" + os.urandom(24).hex(),
            status=status,
            call_id=call_id,
            name=name,
            arguments=arguments,
        )

    @staticmethod
    def usage(finish: Finish | None) -> r.ResponseUsage:
        prompt = finish.prompt_tokens if finish is not None else 0
        output = finish.completion_tokens if finish is not None else 0
        cached = finish.cached_tokens if finish is not None else None
        return r.ResponseUsage(
            input_tokens=prompt,
            input_tokens_details=r.InputTokensDetails(
                cached_tokens=cached or 0,
                # What the engine computed of the prompt, kept in its cache for the next.
                cache_write_tokens=prompt - cached if cached is not None else 0,
            ),
            output_tokens=output,
            output_tokens_details=r.OutputTokensDetails(),
            total_tokens=prompt + output,
        )

    # -- the stream's events ---------------------------------------------------------------
    def _event(self, event: r.ResponseEvent) -> bytes:
        """One SSE event as OpenAI writes it: ``event: <type>`` then the data line."""
        self.seq += 1
        return b"event: %s\ndata: %s\n\n" % (event.type.encode(), _encode(event))

    def _open_message(self) -> list[bytes]:
        item = r.OutputMessage(id="msg_" + os.urandom(24).hex(), status="in_progress", content=[])
        self.open, self.parts = item, []
        index = len(self.items)
        return [
            self._event(
                r.OutputItemEvent(
                    type="response.output_item.added",
                    sequence_number=self.seq,
                    output_index=index,
                    item=item,
                )
            ),
            self._event(
                r.ContentPartEvent(
                    type="response.content_part.added",
                    sequence_number=self.seq,
                    item_id=item.id,
                    output_index=index,
                    content_index=0,
                    part=r.OutputText(text=""),
                )
            ),
        ]

    def _open_call(self, call_id: str, name: str) -> list[bytes]:
        out = self._close("completed")
        item = self.call(call_id, name, "", "in_progress")
        self.open, self.parts = item, []
        out.append(
            self._event(
                r.OutputItemEvent(
                    type="response.output_item.added",
                    sequence_number=self.seq,
                    output_index=len(self.items),
                    item=item,
                )
            )
        )
        return out

    def _text(self, text: str) -> list[bytes]:
        """``text`` added to the open message (one is opened if none is)."""
        out = [] if isinstance(self.open, r.OutputMessage) else self._close("completed")
        if self.open is None:
            out += self._open_message()
        item = self.open
        assert item is not None
        self.parts.append(text)
        out.append(
            self._event(
                r.TextDeltaEvent(
                    sequence_number=self.seq,
                    item_id=item.id,
                    output_index=len(self.items),
                    content_index=0,
                    delta=text,
                )
            )
        )
        return out

    def _args(self, text: str) -> list[bytes]:
        """``text`` added to the open call's arguments."""
        item = self.open
        assert isinstance(item, r.FunctionCallOut)
        self.parts.append(text)
        return [
            self._event(
                r.ArgumentsDeltaEvent(
                    sequence_number=self.seq,
                    item_id=item.id,
                    output_index=len(self.items),
                    delta=text,
                )
            )
        ]

    def _close(self, status: Status) -> list[bytes]:
        """The open item's done events (nothing if none is open)."""
        item, index = self.open, len(self.items)
        if item is None:
            return []
        text = "".join(self.parts)
        out: list[bytes] = []
        done: r.OutputItem
        if isinstance(item, r.OutputMessage):
            part = r.OutputText(text=text)
            out.append(
                self._event(
                    r.TextDoneEvent(
                        sequence_number=self.seq,
                        item_id=item.id,
                        output_index=index,
                        content_index=0,
                        text=text,
                    )
                )
            )
            out.append(
                self._event(
                    r.ContentPartEvent(
                        type="response.content_part.done",
                        sequence_number=self.seq,
                        item_id=item.id,
                        output_index=index,
                        content_index=0,
                        part=part,
                    )
                )
            )
            done = msgspec.structs.replace(item, status=status, content=[part])
        else:
            out.append(
                self._event(
                    r.ArgumentsDoneEvent(
                        sequence_number=self.seq,
                        item_id=item.id,
                        output_index=index,
                        arguments=text,
                    )
                )
            )
            done = msgspec.structs.replace(item, status=status, arguments=text)
        out.append(
            self._event(
                r.OutputItemEvent(
                    type="response.output_item.done",
                    sequence_number=self.seq,
                    output_index=index,
                    item=done,
                )
            )
        )
        self.items.append(done)
        self.open, self.parts = None, []
        return out

    def _piece(self, piece: Piece) -> list[bytes]:
        if isinstance(piece, str):
            return self._text(piece) if piece else []
        assert isinstance(piece, DeltaPiece)
        out = self._text(piece.text) if piece.text else []
        call = piece.call
        if call is not None:
            if call.id is not None or call.name:
                out += self._open_call(call.id or "", call.name or "")
            if call.arguments and isinstance(self.open, r.FunctionCallOut):
                out += self._args(call.arguments)
        return out

    async def events(self, pending: QueuedChoice) -> AsyncGenerator[bytes, None]:
        """The stream of the one choice ``pending``."""
        ev = self._event
        output: Output = pending.start()
        try:
            first = await anext(output, None)  # a failure before it: an HTTP status
            for kind in ("response.created", "response.in_progress"):
                yield ev(
                    r.LifecycleEvent(
                        type=kind,
                        sequence_number=self.seq,
                        response=self.snapshot("in_progress", []),
                    )
                )
            if not self.may_call:
                for e in self._open_message():
                    yield e
            try:
                if first is not None:
                    for e in self._piece(first):
                        yield e
                    async for piece in output:
                        for e in self._piece(piece):
                            yield e
            except ZeroserveError as exc:
                # The head is sent: the failure is an event (OpenAI's ``error``), then the end.
                yield ev(
                    r.ErrorEvent(
                        sequence_number=self.seq, code=exc.code, message=str(exc), param=exc.param
                    )
                )
                return
        finally:
            await output.aclose()
        finish = output.finish()
        cut = finish.reason == "length"
        status: Status = "incomplete" if cut else "completed"
        out: list[bytes] = []
        if self.open is None and not self.items:
            out += self._open_message()  # an empty answer is an empty message
        out += self._close(status)
        for e in out:
            yield e
        final = self.snapshot(status, self.items, self.usage(finish), incomplete=cut)
        yield ev(
            r.LifecycleEvent(type=f"response.{status}", sequence_number=self.seq, response=final)
        )
