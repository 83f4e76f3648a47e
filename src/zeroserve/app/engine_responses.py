"""``POST /v1/responses`` for engine-backed (``llamacpp``) models: the Responses API,
stateless, translated to the engine's chat completions.

Strategy (docs/architecture.md, "The Responses API")
----------------------------------------------------
``xllamacpp.Server`` has no Responses handler (llama.cpp's own ``/v1/responses`` lives
only on its HTTP server, the side door zeroserve keeps locked), so the request is
translated here, once, into a chat completion for ``handle_chat_completions``:

* ``instructions`` becomes the first (system) message, ``input`` the conversation (a
  string is one user message; text parts are joined with newlines; ``developer`` is
  ``system``, which chat templates know); without either, the model's default system
  prompt applies, as on chat;
* ``max_output_tokens``, ``temperature`` and ``top_p`` keep their meaning;
  ``text.format`` becomes ``response_format`` (grammar-enforced by the engine);
* parameters that need state (``previous_response_id``, ``store: true``, ...) or that
  the engine cannot honour get a 400 naming them (``openai/responses.py``).

The engine's answer comes back as chat chunks (streamed from the engine even for a whole
answer, so that a deadline or a client that leaves stops the slot at the next token);
each is decoded once, with msgspec, and turned into OpenAI's Responses shapes: a whole
``response`` object (from the answer ``engine_answers.collect`` assembles), or the stream's
events in OpenAI's exact order and format (``event: <type>`` and ``data: <json>``,
``sequence_number`` from 0): ``response.created``, ``response.in_progress``,
``response.output_item.added``, ``response.content_part.added``, one
``response.output_text.delta`` per engine chunk, then ``response.output_text.done``,
``response.content_part.done``, ``response.output_item.done`` and
``response.completed`` (``response.incomplete`` when ``max_output_tokens`` cut it). A
failure after the first event is an ``error`` event, and the stream ends.
"""

from __future__ import annotations

import os
import time
from collections.abc import AsyncGenerator
from typing import Any, Protocol

import msgspec

from ..errors import RequestError, ZeroserveError
from .engine_answers import collect
from .engine_tools import GeneratedPieces
from .openai import responses as r
from .openai import schemas as s
from .response import EVENT_STREAM, JSON, Response, StreamResponse

_encode = msgspec.json.encode
# Roles of the Responses input as chat templates know them.
_ROLES = {"developer": "system"}
_TEXT_PARTS = frozenset({"input_text", "output_text"})


class ResponsesCall(Protocol):
    """What a Responses answer needs of one engine call (``engine_relay._Run``)."""

    complete: bool

    @property
    def model(self) -> str: ...

    @property
    def timings(self) -> s.EngineTimings | None: ...

    def check(self, chunk: bytes) -> bytes: ...

    async def next_chunk(self) -> bytes | None: ...

    def close(self) -> None: ...


class Translated(msgspec.Struct, kw_only=True):
    """A Responses request as a chat completion for the engine."""

    body: bytes  # the engine's chat request
    messages: list[dict[str, str]]  # its conversation (for an exact token count)
    bound: int  # an upper bound of the prompt's tokens: its UTF-8 bytes
    error_param: str | None  # what an engine refusal names (the schema, if any)


def decode_request(body: memoryview) -> r.ResponsesRequest:
    """The strict decode and the refusals: a 400 naming the first unsupported parameter."""
    req = s.decode(r.responses_decoder, body)
    refused = r.refusals(req)
    if refused:
        param, why = refused[0]
        raise RequestError(f"'{param}' is not supported: {why}", param=param)
    return req


def translate(req: r.ResponsesRequest, alias: str, system_prompt: str | None) -> Translated:
    """The engine's chat request for ``req`` (``model`` set to ``alias``)."""
    messages: list[dict[str, str]] = []
    if req.instructions is not None:
        messages.append({"role": "system", "content": req.instructions})
    if isinstance(req.input, str):
        messages.append({"role": "user", "content": req.input})
    else:
        for i, item in enumerate(req.input):
            messages.append({"role": _ROLES.get(item.role, item.role), "content": _text(item, i)})
    if system_prompt is not None and not any(m["role"] == "system" for m in messages):
        messages.insert(0, {"role": "system", "content": system_prompt})
    # Streamed from the engine, whole answers too, as every engine request is
    # (app/engine_answers.py: each chunk's callback can stop the slot). The usage comes
    # in the last chunk.
    out: dict[str, Any] = {
        "model": alias,
        "messages": messages,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    if req.max_output_tokens is not None:
        out["max_tokens"] = req.max_output_tokens
    if req.temperature is not None:
        out["temperature"] = req.temperature
    if req.top_p is not None:
        out["top_p"] = req.top_p
    fmt = req.text.format if req.text is not None else None
    error_param = None
    if fmt is not None and fmt.type != "text":
        out["response_format"] = _response_format(fmt)
        error_param = "text.format"
    bound = sum(len(m["content"].encode()) for m in messages)
    return Translated(body=_encode(out), messages=messages, bound=bound, error_param=error_param)


def _text(item: r.InputMessage, i: int) -> str:
    if isinstance(item.content, str):
        return item.content
    texts: list[str] = []
    for j, part in enumerate(item.content):
        if part.type not in _TEXT_PARTS or part.text is None:
            raise RequestError(
                "only text content parts (input_text, output_text) are supported",
                param=f"input[{i}].content[{j}]",
            )
        texts.append(part.text)
    return "\n".join(texts)


def _response_format(fmt: r.TextFormat) -> dict[str, Any]:
    if fmt.type == "json_object":
        return {"type": "json_object"}
    if not s.given(fmt.schema):
        raise RequestError(
            "text.format of type json_schema needs a schema", param="text.format.schema"
        )
    if len(fmt.schema) > s.MAX_RESPONSE_FORMAT_BYTES:
        raise RequestError(
            f"text.format.schema is {len(fmt.schema)} bytes; the limit is "
            f"{s.MAX_RESPONSE_FORMAT_BYTES}",
            param="text.format.schema",
        )
    schema: dict[str, Any] = {"name": fmt.name or "response", "schema": fmt.schema}
    if fmt.strict is not None:
        schema["strict"] = fmt.strict
    return {"type": "json_schema", "json_schema": schema}


class ResponsesAnswer:
    """One Responses answer over one engine call: the whole object, or its events."""

    def __init__(self, req: r.ResponsesRequest) -> None:
        self.req = req
        self.ident = "resp_" + os.urandom(24).hex()
        self.item_id = "msg_" + os.urandom(24).hex()
        self.created = int(time.time())
        self.seq = 0

    def _snapshot(
        self,
        model: str,
        status: Any,
        output: list[r.OutputMessage],
        usage: r.ResponseUsage | None = None,
        incomplete: bool = False,
        error: r.ResponseError | None = None,
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
            error=error,
            incomplete_details=r.IncompleteDetails(reason="max_output_tokens")
            if incomplete
            else None,
            instructions=req.instructions,
            max_output_tokens=req.max_output_tokens,
            model=model,
            output=output,
            parallel_tool_calls=req.parallel_tool_calls is not False,
            prompt_cache_key=req.prompt_cache_key,
            safety_identifier=req.safety_identifier,
            temperature=1.0 if req.temperature is None else req.temperature,
            text=r.TextOut(format=fmt_out),
            tool_choice="none" if req.tool_choice == "none" else "auto",
            top_p=1.0 if req.top_p is None else req.top_p,
            usage=usage,
            user=req.user,
            metadata=req.metadata or {},
        )

    def _message(self, text: str, status: Any) -> r.OutputMessage:
        return r.OutputMessage(id=self.item_id, status=status, content=[r.OutputText(text=text)])

    @staticmethod
    def _usage(usage: s.EngineUsage | None, timings: s.EngineTimings | None) -> r.ResponseUsage:
        u = usage or s.EngineUsage()
        cached = timings.cache_n if timings is not None else 0
        return r.ResponseUsage(
            input_tokens=u.prompt_tokens,
            input_tokens_details=r.InputTokensDetails(cached_tokens=cached),
            output_tokens=u.completion_tokens,
            output_tokens_details=r.OutputTokensDetails(),
            total_tokens=u.prompt_tokens + u.completion_tokens,
        )

    async def respond(
        self, run: ResponsesCall, first: bytes, *, chat: bool, stream: bool
    ) -> Response | StreamResponse:
        model = run.model
        if not stream:
            # A deadline, an engine error or the client gone: ``collect`` stops the slot.
            answer = await collect(run, first)
            cut = answer.finish_reason == "length"
            status = "incomplete" if cut else "completed"
            out = self._snapshot(
                model,
                status,
                [self._message(answer.text, status)],
                self._usage(answer.usage, run.timings),
                incomplete=cut,
            )
            return Response(200, [_encode(out)], content_type=JSON)
        return StreamResponse(
            GeneratedPieces(self._events(run, first, model), run.close),
            framing="chunked",
            content_type=EVENT_STREAM,
            headers=[(b"cache-control", b"no-cache")],
        )

    def _event(self, event: r.ResponseEvent) -> bytes:
        """One SSE event as OpenAI writes it: ``event: <type>`` then the data line."""
        self.seq += 1
        return b"event: %s\ndata: %s\n\n" % (event.type.encode(), _encode(event))

    async def _events(
        self, run: ResponsesCall, first: bytes, model: str
    ) -> AsyncGenerator[bytes, None]:
        item, ev = self.item_id, self._event
        yield ev(
            r.LifecycleEvent(
                type="response.created",
                sequence_number=self.seq,
                response=self._snapshot(model, "in_progress", []),
            )
        )
        yield ev(
            r.LifecycleEvent(
                type="response.in_progress",
                sequence_number=self.seq,
                response=self._snapshot(model, "in_progress", []),
            )
        )
        yield ev(
            r.OutputItemEvent(
                type="response.output_item.added",
                sequence_number=self.seq,
                output_index=0,
                item=r.OutputMessage(id=item, status="in_progress", content=[]),
            )
        )
        yield ev(
            r.ContentPartEvent(
                type="response.content_part.added",
                sequence_number=self.seq,
                item_id=item,
                output_index=0,
                content_index=0,
                part=r.OutputText(text=""),
            )
        )
        parts: list[str] = []
        reason = "stop"
        usage: s.EngineUsage | None = None
        chunk: bytes | None = first
        try:
            while chunk is not None:
                data = s.engine_chunk_decoder.decode(run.check(chunk))
                if data.usage is not None:
                    usage = data.usage
                for c in data.choices:
                    text = c.delta.content if c.delta is not None else None
                    if text:
                        parts.append(text)
                        yield ev(
                            r.TextDeltaEvent(
                                sequence_number=self.seq,
                                item_id=item,
                                output_index=0,
                                content_index=0,
                                delta=text,
                            )
                        )
                    if c.finish_reason is not None:
                        reason = c.finish_reason
                chunk = await run.next_chunk()
        except ZeroserveError as exc:
            # The head is sent: the failure is an event (OpenAI's ``error``), then the end.
            yield ev(
                r.ErrorEvent(
                    sequence_number=self.seq, code=exc.code, message=str(exc), param=exc.param
                )
            )
            return
        text = "".join(parts)
        cut = reason == "length"
        status = "incomplete" if cut else "completed"
        part = r.OutputText(text=text)
        yield ev(
            r.TextDoneEvent(
                sequence_number=self.seq, item_id=item, output_index=0, content_index=0, text=text
            )
        )
        yield ev(
            r.ContentPartEvent(
                type="response.content_part.done",
                sequence_number=self.seq,
                item_id=item,
                output_index=0,
                content_index=0,
                part=part,
            )
        )
        done = self._message(text, status)
        yield ev(
            r.OutputItemEvent(
                type="response.output_item.done",
                sequence_number=self.seq,
                output_index=0,
                item=done,
            )
        )
        final = self._snapshot(
            model, status, [done], self._usage(usage, run.timings), incomplete=cut
        )
        yield ev(
            r.LifecycleEvent(type=f"response.{status}", sequence_number=self.seq, response=final)
        )
