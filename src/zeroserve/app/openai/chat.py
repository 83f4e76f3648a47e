"""The chat completions and completions front ends (``/v1/chat/completions``,
``/v1/completions``): each request decoded once, from the body view, into the one chat
request (docs/architecture.md, "One chat path"); the answer written as OpenAI's
``chat.completion`` / ``text_completion`` object, or streamed as its chunks
(``streaming.py``).

Checked here, the same for every backend: the schema (a 400 naming the field; unknown
fields refused by name), the API limits (messages, choices, stop strings, tools, the
request's output-token budget: ``app/limits.py``), the rules between fields
(``top_logprobs`` needs ``logprobs``; ``tool_choice`` needs ``tools`` and names only
tools in them; a ``json_schema`` format needs its ``schema``), and what no backend here
serves (content parts other than text and a user's images, completions' ``echo``, ``suffix``, ``best_of`` > 1 and
token-array prompts). Nulls OpenAI allows are defaults. Whether the serving model
honours a parameter is its backend's to say.
"""

from __future__ import annotations

import os
import time
from typing import Any

import msgspec

from ...errors import RequestError
from ..chat import ChatRequest, Choices, FunctionTool, OutputFormat, ToolCall, ToolChoice, Turn
from ..chat.choices import collect_all
from ..chat.images import ImagePart, ImageReader
from ..deadlines import openai_timeout
from ..keep_alive import keep_alive_s
from ..limits import ApiLimits, check_count, check_output_tokens, decoding
from ..request import Request
from ..response import JSON, HandlerResult, Response, StreamResponse
from . import schemas as s
from .chunks import Chunks
from .streaming import ChoiceStream, usage

# The "developer" role replaced "system" in newer OpenAI models; templates know "system".
_ROLES: dict[str, Any] = {"developer": "system"}
# Roles whose turn must carry content (an assistant's may be calls only).
_CONTENT_REQUIRED = frozenset(("system", "developer", "user", "tool"))


def _new_id(prefix: str) -> str:
    return prefix + os.urandom(12).hex()


def stops(stop: str | list[str] | None, limits: ApiLimits) -> list[str]:
    """The stop strings, within the limit, empty ones dropped (they match nothing)."""
    out = [stop] if isinstance(stop, str) else list(stop or ())
    check_count(len(out), limits.stop, "stop", "stop sequences")
    return [x for x in out if x]


def raw_param(decoder: msgspec.json.Decoder[Any], raw: msgspec.Raw, param: str) -> Any:
    """``raw`` (the value of ``param``, kept raw by the request's schema) decoded, or a
    400 naming the field within it."""
    try:
        with decoding(param):
            return decoder.decode(raw)
    except (msgspec.ValidationError, msgspec.DecodeError) as exc:
        message, inner = s.split_path(str(exc))
        full = param if not inner else param + ("" if inner[0] == "[" else ".") + inner
        raise RequestError(f"invalid parameter '{full}': {message}", param=full) from None


def response_format(raw: msgspec.Raw | msgspec.UnsetType, param: str) -> OutputFormat | None:
    """The ``response_format`` of a chat request, its size checked before it is read."""
    if not s.given(raw):
        return None
    if len(raw) > s.MAX_RESPONSE_FORMAT_BYTES:
        raise RequestError(
            f"{param} is {len(raw)} bytes; the limit is {s.MAX_RESPONSE_FORMAT_BYTES}",
            param=param,
        )
    fmt: s.ResponseFormat = raw_param(s.response_format_decoder, raw, param)
    if fmt.type != "json_schema":
        return OutputFormat(fmt.type)
    js = fmt.json_schema
    schema = None if js is None else s.json_object(js.schema, f"{param}.json_schema.schema")
    if js is None or schema is None:
        raise RequestError(
            f"{param} of type json_schema needs json_schema.schema",
            param=f"{param}.json_schema.schema",
        )
    return OutputFormat(
        "json_schema", schema, name=js.name, description=js.description, strict=js.strict
    )


def check_tools(tools: list[FunctionTool], choice: ToolChoice | None, limits: ApiLimits) -> None:
    """The rules of tools every API shares: some, within the count, named once each; a
    choice names only tools among them."""
    if not tools:
        raise RequestError("tools must not be empty", param="tools")
    check_count(len(tools), limits.tools, "tools", "tools")
    names = [t.name for t in tools]
    if len(set(names)) != len(names):
        raise RequestError("tool names must be unique", param="tools")
    if choice is not None and choice.allowed is not None:
        known = set(names)
        if any(name not in known for name in choice.allowed):
            raise RequestError(
                "tool_choice names a function that is not in tools", param="tool_choice"
            )


def decode_tools(
    raw_tools: msgspec.Raw | msgspec.UnsetType,
    raw_choice: msgspec.Raw | msgspec.UnsetType,
    limits: ApiLimits,
) -> tuple[list[FunctionTool] | None, ToolChoice | None]:
    """``tools`` and ``tool_choice`` in chat's shape (kept raw at first), decoded and
    checked (the rules every API shares: :func:`check_tools`)."""
    choice: ToolChoice | None = None
    if s.given(raw_choice):
        c = raw_param(s.tool_choice_decoder, raw_choice, "tool_choice")
        if isinstance(c, s.NamedToolChoice):
            choice = ToolChoice("required", (c.function.name,))
        elif isinstance(c, s.AllowedToolChoice):
            a = c.allowed_tools
            choice = ToolChoice(a.mode, tuple(t.function.name for t in a.tools))
        else:
            choice = ToolChoice(c)
    if not s.given(raw_tools):
        if choice is not None and choice.mode != "none":
            raise RequestError("tool_choice needs tools", param="tool_choice")
        return None, choice
    if len(raw_tools) > s.MAX_TOOLS_BYTES:
        raise RequestError(
            f"tools is {len(raw_tools)} bytes; the limit is {s.MAX_TOOLS_BYTES}", param="tools"
        )
    decoded: list[s.Tool] = raw_param(s.tools_decoder, raw_tools, "tools")
    tools = [
        FunctionTool(
            t.function.name,
            t.function.description,
            s.json_object(t.function.parameters, f"tools[{i}].function.parameters"),
            t.function.strict,
        )
        for i, t in enumerate(decoded)
    ]
    check_tools(tools, choice, limits)
    return tools, choice


def sampling(
    body: s.ChatCompletionRequest | s.CompletionRequest, max_tokens: int | None
) -> dict[str, Any]:
    """vLLM's sampling extensions and ``stream_options`` as the chat request's keyword
    arguments (``top_k`` -1 or 0 is every token: not given).

    ``min_tokens`` is served with ``ignore_eos`` and no ``stop``, which imply it (the
    answer runs to ``max_tokens``): no engine here can hold back its end for a number of
    tokens and then let it come (llama.cpp's has no such field), so any other use is a
    400 naming it, as is ``min_tokens`` above ``max_tokens`` (vLLM's rule)."""
    if body.min_tokens:
        if not body.ignore_eos or body.stop is not None:
            raise RequestError(
                "min_tokens is served only with ignore_eos: true and no stop, which make "
                "the answer run to max_tokens",
                param="min_tokens",
            )
        if max_tokens is not None and body.min_tokens > max_tokens:
            raise RequestError("min_tokens must be at most max_tokens", param="min_tokens")
    options = body.stream_options
    include_usage = bool(options and options.include_usage)
    continuous = bool(options and options.continuous_usage_stats)
    if continuous and not include_usage:
        raise RequestError(
            "stream_options.continuous_usage_stats needs include_usage: true",
            param="stream_options.continuous_usage_stats",
        )
    return {
        "top_k": body.top_k if body.top_k is not None and body.top_k > 0 else None,
        "min_p": body.min_p,
        "repetition_penalty": body.repetition_penalty,
        "ignore_eos": bool(body.ignore_eos),
        "min_tokens": body.min_tokens,
        "include_usage": include_usage,
        "continuous_usage": continuous,
    }


def turn(m: s.Message, i: int, images: ImageReader) -> Turn:
    """Message ``i`` of a chat request as a conversation turn (text parts joined, images
    read by ``images``)."""
    if m.function_call is not None:
        raise RequestError(
            "function_call is deprecated and not supported; use tool_calls",
            param=f"messages[{i}].function_call",
        )
    content = m.content
    if content is None:
        if m.role in _CONTENT_REQUIRED:
            raise RequestError(f"a {m.role} message needs content", param=f"messages[{i}].content")
        text: str | None = None if m.tool_calls else ""
    elif isinstance(content, str):
        text = content
    else:
        texts: list[str] = []
        parts: list[str | ImagePart] = []
        for j, part in enumerate(content):
            where = f"messages[{i}].content[{j}]"
            if part.type == "image_url" and m.role == "user":
                url = part.image_url
                if url is None or part.text is not None:
                    raise RequestError(
                        'an image part is {"type": "image_url", "image_url": {"url": ...}}',
                        param=where,
                    )
                parts.append(
                    images.url(
                        url.url, where, detail=url.detail, detail_param=f"{where}.image_url.detail"
                    )
                )
                continue
            if part.type != "text" or part.text is None or part.image_url is not None:
                raise RequestError(
                    'only text content parts ({"type": "text", "text": ...}), and image '
                    "parts in user messages, are supported",
                    param=where,
                )
            texts.append(part.text)
            parts.append(part.text)
        # Text parts are joined with newlines (as vLLM does) into one message text.
        text = "\n".join(texts)
        if len(parts) > len(texts):
            return Turn("user", text, m.name, parts=parts)
    calls = (
        [ToolCall(c.id or "", c.function.name, c.function.arguments) for c in m.tool_calls]
        if m.tool_calls
        else None
    )
    return Turn(_ROLES.get(m.role, m.role), text, m.name, calls, m.tool_call_id)


class _Answers:
    """What the chat completions and completions front ends share: the answer."""

    chat: bool
    upstream_path: str

    def __init__(self, limits: ApiLimits) -> None:
        self.limits = limits

    def _counts(self, chat: ChatRequest) -> None:
        limits = self.limits
        check_count(chat.n, limits.n, "n", "choices")
        check_count(chat.generations, limits.generations, "n", "generations (prompts x n)")
        check_output_tokens(chat.generations, chat.max_tokens, limits, chat.param("max_tokens"))

    def respond(self, choices: Choices, chat: ChatRequest, req: Request) -> HandlerResult:
        ident = _new_id("chatcmpl-" if self.chat else "cmpl-")
        created = int(time.time())
        if chat.stream:
            chunks = Chunks(
                chat=self.chat,
                ident=ident,
                created=created,
                model=chat.model,
                usage=chat.include_usage,
                continuous=chat.continuous_usage,
            )
            stream = ChoiceStream(
                chunks,
                choices,
                n=chat.n,
                include_usage=chat.include_usage,
                continuous=chat.continuous_usage,
            )
            return StreamResponse(stream, framing="sse")
        return self._whole(choices, chat, ident, created)

    async def _whole(
        self, choices: Choices, chat: ChatRequest, ident: str, created: int
    ) -> Response:
        answers = await collect_all(choices)
        finishes = [a.finish for a in answers if a.finish is not None]
        total = usage(finishes, chat.n)
        if self.chat:
            out: Any = s.ChatCompletion(
                ident,
                "chat.completion",
                created,
                chat.model,
                [
                    s.ChatChoice(
                        a.index,
                        _chat_message(a.text, a.parts, a.tool_calls(), a.reasoning),
                        a.logprobs_raw(),
                        a.finish.reason if a.finish is not None else "stop",
                    )
                    for a in answers
                ],
                total,
            )
        else:
            out = s.Completion(
                ident,
                "text_completion",
                created,
                chat.model,
                [
                    s.CompletionChoice(
                        a.text,
                        a.index,
                        a.logprobs_raw(),
                        a.finish.reason if a.finish is not None else "stop",
                    )
                    for a in answers
                ],
                total,
            )
        return Response(200, [s.encoder.encode(out)], content_type=JSON)


def _chat_message(
    text: str, parts: list[str], calls: list[ToolCall], reasoning: list[str]
) -> s.ChatMessage:
    msg = s.ChatMessage("assistant", text if parts or not calls else None)
    if calls:
        msg.tool_calls = [
            s.ToolCallOut(c.id, "function", s.FunctionCall(c.name, c.arguments)) for c in calls
        ]
    if reasoning:
        msg.reasoning_content = "".join(reasoning)
    return msg


class ChatCompletions(_Answers):
    """``POST /v1/chat/completions``."""

    chat = True
    upstream_path = "/chat/completions"

    def decode(self, req: Request) -> ChatRequest:
        chat = self.parse(req.body)
        chat.timeout = openai_timeout(req, stream=chat.stream)
        return chat

    def parse(self, data: memoryview) -> ChatRequest:
        """The request body as the one chat request (what :meth:`decode` reads)."""
        body = s.decode(s.chat_decoder, data)
        limits = self.limits
        check_count(len(body.messages), limits.messages, "messages", "messages")
        if body.top_logprobs and not body.logprobs:
            raise RequestError("top_logprobs needs logprobs: true", param="top_logprobs")
        tools, choice = decode_tools(body.tools, body.tool_choice, limits)
        max_tokens = (
            body.max_completion_tokens
            if body.max_completion_tokens is not None
            else body.max_tokens
        )
        images = ImageReader(limits)
        chat = ChatRequest(
            model=body.model,
            messages=[turn(m, i, images) for i, m in enumerate(body.messages)],
            n=body.n or 1,
            max_tokens=max_tokens,
            temperature=body.temperature,
            top_p=body.top_p,
            seed=body.seed,
            priority=body.priority,
            keep_alive=keep_alive_s(body.keep_alive),
            stop=stops(body.stop, limits),
            presence_penalty=body.presence_penalty,
            frequency_penalty=body.frequency_penalty,
            logit_bias=body.logit_bias,
            logprobs=bool(body.logprobs),
            top_logprobs=body.top_logprobs,
            response_format=response_format(body.response_format, "response_format"),
            tools=tools,
            tool_choice=choice,
            parallel_tool_calls=body.parallel_tool_calls,
            stream=bool(body.stream),
            names=_CHAT_NAMES[body.max_completion_tokens is not None],
            **sampling(body, max_tokens),
        )
        self._counts(chat)
        return chat


# How chat spells the internal names (``max_tokens``: whichever of its two it sent).
_CHAT_NAMES = {
    False: {"max_tokens": "max_tokens"},
    True: {"max_tokens": "max_completion_tokens"},
}
_COMPLETION_NAMES = {"messages": "prompt", "top_logprobs": "logprobs"}


class Completions(_Answers):
    """``POST /v1/completions``: each prompt ``n`` choices, no chat template."""

    chat = False
    upstream_path = "/completions"

    def decode(self, req: Request) -> ChatRequest:
        chat = self.parse(req.body)
        chat.timeout = openai_timeout(req, stream=chat.stream)
        return chat

    def parse(self, data: memoryview) -> ChatRequest:
        """The request body as the one chat request (what :meth:`decode` reads)."""
        body = s.decode(s.completion_decoder, data)
        limits = self.limits
        for name, bad in (
            ("echo", bool(body.echo)),
            ("best_of", body.best_of is not None and body.best_of > 1),
            ("suffix", body.suffix is not None),
        ):
            if bad:
                raise RequestError(f"'{name}' is not supported by this server", param=name)
        prompt = body.prompt
        if isinstance(prompt, list):
            check_count(len(prompt), limits.prompts, "prompt", "prompts")
            if not all(isinstance(p, str) for p in prompt):
                raise RequestError(
                    "token-array prompts are not supported by this server; send text",
                    param="prompt",
                )
        prompts = [prompt] if isinstance(prompt, str) else [str(p) for p in prompt]
        if not prompts:
            raise RequestError("prompt must not be an empty list", param="prompt")
        chat = ChatRequest(
            model=body.model,
            prompts=prompts,
            n=body.n or 1,
            max_tokens=body.max_tokens,
            temperature=body.temperature,
            top_p=body.top_p,
            seed=body.seed,
            priority=body.priority,
            keep_alive=keep_alive_s(body.keep_alive),
            stop=stops(body.stop, limits),
            presence_penalty=body.presence_penalty,
            frequency_penalty=body.frequency_penalty,
            logit_bias=body.logit_bias,
            logprobs=body.logprobs is not None,
            top_logprobs=body.logprobs,
            stream=bool(body.stream),
            names=_COMPLETION_NAMES,
            **sampling(body, body.max_tokens),
        )
        self._counts(chat)
        return chat
