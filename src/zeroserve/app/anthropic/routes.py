"""Anthropic's Messages API routes: ``POST /v1/messages`` and ``POST
/v1/messages/count_tokens`` (docs/architecture.md, "Anthropic's Messages API").

Each route is one line over the backend table, as the OpenAI routes are: the body's
``model`` decides the backend once. Every error under ``/v1/messages`` (those answered
at the head too: limits, keys, quotas, a busy server) is in Anthropic's shape, by the
router's error family.
"""

from __future__ import annotations

import msgspec

from ...errors import RequestError
from ..backends import Backends
from ..chat import ChatRequest
from ..limits import ApiLimits
from ..openai.schemas import decode
from ..request import Request
from ..response import JSON, HandlerResult, Response
from ..router import RouteDoc, Router
from . import schemas as a
from .messages import Messages, prompt

COUNT_PATH = "/messages/count_tokens"


def register(router: Router, backends: Backends, limits: ApiLimits | None = None) -> None:
    api = _Anthropic(backends, limits or ApiLimits())
    router.error_family("/v1/messages", "anthropic")
    router.add(
        "POST",
        "/v1/messages",
        api.messages,
        errors="anthropic",
        doc=RouteDoc(
            "Messages (Anthropic); text/event-stream of Anthropic's events when stream is true",
            a.MessagesRequest,
            a.AnthropicMessage,
            a.EVENT_TYPES,
        ),
    )
    router.add(
        "POST",
        "/v1/messages/count_tokens",
        api.count_tokens,
        errors="anthropic",
        doc=RouteDoc(
            "Count a Messages request's input tokens (Anthropic)",
            a.CountTokensRequest,
            a.TokenCount,
        ),
    )


class _Anthropic:
    def __init__(self, backends: Backends, limits: ApiLimits) -> None:
        self.backends = backends
        self.limits = limits
        self._messages = Messages(limits)

    def messages(self, req: Request) -> HandlerResult:
        return self.backends.chat(self._messages, req)

    def count_tokens(self, req: Request) -> HandlerResult:
        return self.backends.count_tokens(req, self._count_request, COUNT_PATH, _count)

    def _count_request(self, req: Request) -> ChatRequest:
        body = decode(a.count_decoder, req.body)
        p = prompt(body.system, body.messages, body.tools, body.tool_choice, self.limits)
        if not p.turns:
            raise RequestError("messages must not be empty", param="messages")
        return ChatRequest(
            model=body.model,
            messages=p.turns,
            tools=p.tools,
            tool_choice=p.choice,
            parallel_tool_calls=p.parallel,
        )


def _count(tokens: int) -> Response:
    return Response(
        200, [msgspec.json.encode(a.TokenCount(input_tokens=tokens))], content_type=JSON
    )
