"""The relay of one remote model: balancing, fail-over, and the response it hands back.

Strategy
--------
``forward(req, path)`` picks the healthy upstream with the fewest requests in flight
(ties in turn), sends the client's body from its lease (or with only ``"model"``
rewritten), and waits for the response head. A refused connection, or a 5xx head, goes
to another upstream once (``retries``) — always before a byte reached the client,
because nothing is returned until the head has been judged.

The answer keeps the upstream's status, end-to-end headers and body bytes:

* a body of known length up to ``WHOLE_BODY_MAX_BYTES`` is read to the end and returned
  as a ``Response`` of the received views (no chunking for small JSON answers);
* anything else (SSE, chunked, large) is a ``StreamResponse(framing="chunked")`` whose
  pieces are lists of raw upstream views: every pending read goes out in one write,
  and the exchange's bounded queue pauses the upstream while the client lags.

The access log and a key's token quota see a relayed request's model (this remote
model's name) and its tokens as the upstream's own ``usage`` reports them (``_usage.py``),
counted as soon as it is read, before the bytes after it are relayed (so a client that
leaves at ``[DONE]`` has spent them; a larger cumulative report later counts only the
difference); only JSON and event-stream answers are read for it, and only when the edge
uses the count. While it does, a streamed chat or completion that did not ask for
``stream_options.include_usage`` is sent asking for it (``_rewrite.rewrite_body``), and
the usage chunk its client did not ask for is taken out of its stream
(``_strip.UsageChunkFilter``); every other body and stream is relayed as it came.

An upstream that does not accept ``stream_options`` answers such a request with a 400
(or 422) the client's own request would not have met. So a 400/422 to a request whose
``stream_options`` the relay added is sent once more to the same upstream without it
(the client's body, still in its lease: views, no copy), before anything reached the
client; the upstream is then known to refuse it (per upstream URL and route) when its
error names ``stream_options`` (which the client did not send) or the request without
it succeeds, and later streams go out without it from the start. An upstream that has
accepted the option is resent to only when its error names it (a client's bad request
is not sent twice). At most one such resend a request; a client that sent
``stream_options`` itself gets the upstream's answer as it came. A chat or completion
stream's tokens are counted from its chunks as they pass (``_deltas.DeltaCounter``:
one per non-empty content delta), until a usage from the upstream says more: so a
stream whose upstream refuses or ignores the option is still counted (an estimate),
and every stream is debited as it is produced.

The admission ticket is held until the response is over. A client disconnect cancels
the handler or the stream, which aborts the upstream connection at once.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import math
import os
import re
import ssl
import time
from collections.abc import Callable
from dataclasses import dataclass

from prometheus_client import Counter, Histogram

from ... import metrics
from ...errors import (
    DeadlineExceeded,
    UpstreamError,
    UpstreamUnavailable,
    UpstreamUnreachable,
    ZeroserveError,
)
from ...http.client import Framing, ResponseHead, request_head, response_headers
from ...models.remote import RemoteOptions
from ...upstream import Exchange, Upstream, UpstreamConnection, UpstreamStatistics
from ..request import Request
from ..response import Response, StreamResponse
from ._deltas import DeltaCounter
from ._rewrite import rewrite_body
from ._stream import RelayedStream
from ._strip import UsageChunkFilter
from ._usage import UsageScanner

Buffer = bytes | bytearray | memoryview

log = logging.getLogger("zeroserve.relay")

# Largest upstream body (with a Content-Length) read whole before answering; larger ones
# are streamed. Chat and embedding answers are a few KiB; 1 MiB keeps the common case
# one fixed-length write while bounding what a request can hold.
WHOLE_BODY_MAX_BYTES = 1 << 20
# The routes whose streams report usage only when asked (``stream_options``).
_USAGE_ROUTES = frozenset(("/chat/completions", "/completions"))
# A client's credential headers: meant for this server, not for the upstream.
# The upstream route of Anthropic's Messages API (and its token count).
MESSAGES_PATH = "/messages"
# Routes served beside the API's base rather than under it (vLLM's and llama.cpp's
# /tokenize and /detokenize sit at the root while the model is relayed to .../v1): sent
# to the base URL's path without a final "/v1".
ROOT_PATHS = frozenset(("/tokenize", "/detokenize"))
_CREDENTIALS = frozenset((b"authorization", b"api-key", b"x-api-key"))
# The statuses with which OpenAI-compatible servers refuse a field they do not accept
# (400; 422 from FastAPI/pydantic validation).
_REFUSALS = frozenset((400, 422))
# An error body that names the field the relay added.
_NAMES_OPTION = re.compile(rb"stream_options|include_usage")

_BUCKETS = (
    0.0001,
    0.00025,
    0.0005,
    0.001,
    0.002,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1,
    2.5,
    5,
    10,
    30,
    60,
)
TTFB_SECONDS = Histogram(
    "zeroserve_upstream_ttfb_seconds",
    "Time from a relayed request written to its upstream to the upstream's response head.",
    ["model", "upstream"],
    registry=metrics.REGISTRY,
    buckets=_BUCKETS,
)
OVERHEAD_SECONDS = Histogram(
    "zeroserve_relay_overhead_seconds",
    "Time a relayed request spends inside zeroserve: from the complete client request to "
    "the upstream request written, plus from the upstream answer to the response handed "
    "to the client writer.",
    ["model", "upstream"],
    registry=metrics.REGISTRY,
    buckets=_BUCKETS,
)
REFUSED = Counter(
    "zeroserve_relay_stream_options_refused",
    "Relayed streams an upstream refused (400/422) for the stream_options the gateway "
    "added to count their tokens; each was sent once more without it.",
    ["model"],
    registry=metrics.REGISTRY,
)
ESTIMATED = Counter(
    "zeroserve_relay_usage_estimated",
    "Relayed streams whose tokens were estimated (one per non-empty content delta) "
    "because their upstream reported no usage (it refuses or ignores stream_options).",
    ["model"],
    registry=metrics.REGISTRY,
)


@dataclass(frozen=True, slots=True)
class RelayStatistics:
    model: str
    requests: int
    retries: int  # requests sent again to another upstream
    unavailable: int  # 503: no healthy upstream
    unreachable: int  # 502: no upstream answered
    timeouts: int  # 504 (or a stream cut at its deadline)
    client_disconnects: int  # responses abandoned by their client
    refusals: int  # sent once more without the stream_options the relay added
    estimated: int  # streams counted by the estimate alone (no usage from the upstream)
    upstreams: dict[str, UpstreamStatistics]


class Relay:
    """Relays requests for one remote model to its upstreams."""

    def __init__(
        self,
        name: str,
        options: RemoteOptions,
        *,
        api_key: str | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.name = name
        self.options = options
        self.clock = clock
        ctx = ssl.create_default_context() if any(u.tls for u in options.upstreams) else None
        self.upstreams = [Upstream(u, options, self._now, ctx) for u in options.upstreams]
        self._extra: list[tuple[bytes, bytes]] = []
        # Anthropic's Messages routes take the key as x-api-key (its API reads a Bearer
        # token as another kind of credential); a zeroserve upstream takes either.
        self._extra_messages: list[tuple[bytes, bytes]] = []
        if api_key:
            self._extra.append((b"authorization", b"Bearer " + api_key.encode("latin-1")))
            self._extra_messages.append((b"x-api-key", api_key.encode("latin-1")))
        self.upstream_model = options.upstream_model or name
        self._turn = itertools.count()
        self._ttfb = {u.url.url: TTFB_SECONDS.labels(name, u.url.url) for u in self.upstreams}
        self._overhead = {
            u.url.url: OVERHEAD_SECONDS.labels(name, u.url.url) for u in self.upstreams
        }
        self.requests = self.retries = self.unavailable = self.unreachable = 0
        self.timeouts = self.client_disconnects = 0
        self.refusals = self.estimated = 0
        self._refused_total = REFUSED.labels(name)
        self._estimated_total = ESTIMATED.labels(name)
        # Whether an upstream accepts the stream_options the relay adds, by (upstream
        # URL, route): True once it answered a request with it, False once it refused
        # it; absent while unknown.
        self.stream_options: dict[tuple[str, str], bool] = {}

    def _client_headers(self, req: Request) -> list[tuple[bytes, bytes]]:
        """The client's headers for the upstream: without its credentials unless the
        model forwards them (``forward_client_key``)."""
        headers = req.head.headers
        if self.options.forward_client_key:
            return headers
        return [h for h in headers if h[0] not in _CREDENTIALS]

    def _now(self) -> float:
        return self.clock()  # late-bound, so tests may swap ``clock``

    def raw_path(self) -> str:
        """The upstream path of this model's raw endpoint (relative to the base URL)."""
        return f"/raw/{self.upstream_model}"

    # -- forwarding ------------------------------------------------------------------------
    async def forward(
        self, req: Request, path: str, *, rewrite_model: bool = True
    ) -> Response | StreamResponse:
        """Relay ``req`` to ``base URL + path`` (plus the client's query string) and return
        the upstream's answer. ``rewrite_model``: set the JSON body's ``"model"`` to the
        ``upstream_model`` option, if given. Raises ``ZeroserveError`` (502/503/504)."""
        t0 = time.perf_counter()
        self.requests += 1
        try:
            return await self._forward(req, path, rewrite_model, t0)
        except BaseException as exc:
            # A ticket not yet handed to a stream stays with the request (the server
            # releases it with the request).
            if isinstance(exc, DeadlineExceeded):
                self.timeouts += 1
            elif isinstance(exc, asyncio.CancelledError):
                self.client_disconnects += 1
            raise

    async def _forward(
        self, req: Request, path: str, rewrite: bool, t0: float
    ) -> Response | StreamResponse:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.options.timeout
        body: list[Buffer] = [req.body] if len(req.body) else []
        model = (self.options.upstream_model or None) if rewrite else None
        edge = req.edge
        ask_usage = edge is not None and edge.counting and path in _USAGE_ROUTES
        # With ``asked``: ``body`` asks for the usage on the client's behalf, ``unasked``
        # is the same body without that (for an upstream that refuses stream_options).
        asked = own = False
        unasked = body
        if body and (model is not None or ask_usage):
            rewritten = rewrite_body(req.body, model=model, ask_usage=ask_usage)
            if rewritten.body is not None:
                if rewritten.asked_usage:
                    asked, own = True, rewritten.own_options
                    if rewritten.unasked is not None:
                        unasked = rewritten.unasked
                body = rewritten.body
        query = req.head.query
        extra = self._extra_messages if path.startswith(MESSAGES_PATH) else self._extra
        if edge is not None:
            edge.model = self.name
            # The id the client sees is the one the upstream logs, and the upstream's
            # spans join this request's trace (these replace the client's own headers).
            extra = [*extra, *edge.upstream_headers()]
        tried: list[Upstream] = []
        last: UpstreamError | None = None
        # Where it was refused, once sent again without the stream_options the relay added.
        resent: tuple[str, str] | None = None
        again: Upstream | None = None  # the upstream to send it to
        while again is not None or len(tried) <= self.options.retries:
            if again is not None:
                up, again = again, None
            else:
                chosen = self._choose(tried)
                if chosen is None:
                    break
                up = chosen
                if tried:
                    self.retries += 1
                tried.append(up)
            option = (up.url.url, path)
            spliced = asked and resent is None and self.stream_options.get(option) is not False
            send = body if spliced or not asked else unasked
            size = sum(b.nbytes if isinstance(b, memoryview) else len(b) for b in send)
            base = up.url.base_path
            if path in ROOT_PATHS:
                base = base.removesuffix("/v1")
            target = base + path + ("?" + query if query else "")
            head = request_head(
                req.method, target, up.url.authority, size, self._client_headers(req), extra
            )
            try:
                ex, rhead, written = await up.exchange(req.method, [head, *send], deadline)
            except UpstreamUnreachable as exc:
                up.record_failure()
                last = exc
                continue
            except ZeroserveError:
                up.record_failure()
                raise
            t_head = time.perf_counter()
            self._ttfb[up.url.url].observe(t_head - written)
            if rhead.status >= 500:
                up.record_failure()
                if len(tried) <= self.options.retries and self._choose([*tried]) is not None:
                    ex.finish(False)
                    continue
            else:
                up.record_success()
            views: list[memoryview] | None = None
            try:
                if spliced and rhead.status in _REFUSALS:
                    views = await self._refused(up, ex, rhead, option, own)
                    if ex.finished:  # to be sent once more, without the option
                        resent = option
                        again = up
                        continue
                elif spliced and rhead.status < 400:
                    self.stream_options[option] = True
                elif resent == option and rhead.status < 400:
                    self._refuses(up, option)  # without the option, the request succeeds
                deltas = path in _USAGE_ROUTES
                return await self._respond(req, up, ex, t0, written, t_head, spliced, deltas, views)
            except BaseException:
                ex.finish(False)
                raise
        if last is not None:
            self.unreachable += 1
            raise last
        self.unavailable += 1
        raise self._unavailable()

    async def _refused(
        self,
        up: Upstream,
        ex: Exchange[UpstreamConnection],
        rhead: ResponseHead,
        option: tuple[str, str],
        own: bool,
    ) -> list[memoryview] | None:
        """A 400/422 to a request whose ``stream_options`` the relay added (``own``: to
        the client's own object). Either the exchange is finished (send the request once
        more, without the option), or the answer is the client's: the error body is
        returned if it was read (a body to be read whole), None if not (to be relayed as
        it comes). An error that names the option the client did not send at all
        proves the refusal; otherwise the resend's success does."""
        views: list[memoryview] | None = None
        named = False
        if _whole(rhead):
            views = await self._read(up, ex)
            named = _names_option(views)
        if not named and self.stream_options.get(option):
            return views  # it accepts the option: the error is about the client's request
        ex.finish(views is not None)
        self.refusals += 1
        self._refused_total.inc()
        if named and not own:
            self._refuses(up, option)
        return None

    def _refuses(self, up: Upstream, option: tuple[str, str]) -> None:
        """The upstream is known to refuse ``stream_options`` on this route (logged the
        first time): later requests go without it, their tokens estimated."""
        if self.stream_options.get(option) is not False:
            self.stream_options[option] = False
            log.warning(
                "the upstream %s of model %r refuses stream_options on %s: its streams "
                "are relayed without it and their tokens estimated, one per content delta "
                '(docs/architecture.md, "The edge")',
                up.url.url,
                self.name,
                option[1],
            )

    @staticmethod
    async def _read(up: Upstream, ex: Exchange[UpstreamConnection]) -> list[memoryview]:
        """The rest of the upstream's body, to its end."""
        views: list[memoryview] = []
        while True:
            try:
                batch = await ex.next_batch()
            except ZeroserveError:
                up.record_failure()
                raise
            if batch is None:
                return views
            views += batch

    async def _respond(
        self,
        req: Request,
        up: Upstream,
        ex: Exchange[UpstreamConnection],
        t0: float,
        written: float,
        t_head: float,
        strip: bool,
        deltas: bool,
        views: list[memoryview] | None,
    ) -> Response | StreamResponse:
        """The upstream's answer for the client. ``strip``: the usage was asked for on
        the client's behalf, so an event stream's usage chunk is taken out. ``deltas``: a
        chat or completion, whose event stream's tokens are counted from its chunks until
        (unless) the upstream's usage says more. ``views``: the whole body, if read."""
        rhead = ex.head.result()
        headers, content_type = response_headers(rhead)
        overhead = self._overhead[up.url.url]
        edge = req.edge
        stream = _is_event_stream(content_type)
        usage: UsageScanner | DeltaCounter | None = None
        if edge is not None and edge.counting and _reports_usage(content_type):
            usage = DeltaCounter() if deltas and stream else UsageScanner()
        events = UsageChunkFilter() if strip and stream else None
        if views is not None or _whole(rhead):
            if views is None:
                views = await self._read(up, ex)
            t_end = time.perf_counter()
            ex.finish(True)
            if req.has_ticket:
                req.take_ticket().release()
            if usage is not None and edge is not None:
                for view in views:
                    usage.feed(view)
                if usage.tokens:
                    edge.count_tokens(usage.tokens)
                if isinstance(usage, DeltaCounter) and usage.estimated:
                    self.count_estimate()
            if events is not None:
                views = [*events.feed(views), *events.flush()]
            if content_type is not None:
                headers.append((b"content-type", content_type))
            overhead.observe((written - t0) + (time.perf_counter() - t_end))
            return Response(rhead.status, views, headers=headers)
        pieces = RelayedStream(self, up, ex, req.take_ticket() if req.has_ticket else None)
        if usage is not None:
            pieces.usage, pieces.edge = usage, edge
        pieces.events = events
        overhead.observe((written - t0) + (time.perf_counter() - t_head))
        return StreamResponse(
            pieces,
            framing="chunked",
            status=rhead.status,
            content_type=content_type,
            headers=headers,
        )

    def count_estimate(self) -> None:
        """A stream's tokens were estimated: its upstream reported no usage."""
        self.estimated += 1
        self._estimated_total.inc()

    def _choose(self, tried: list[Upstream]) -> Upstream | None:
        """Least outstanding requests among the healthy upstreams not yet tried."""
        now = self.clock()
        best: Upstream | None = None
        ups = self.upstreams
        start = next(self._turn) % len(ups)
        for i in range(len(ups)):
            up = ups[(start + i) % len(ups)]
            if up in tried or not up.healthy(now):
                continue
            if best is None or up.in_flight < best.in_flight:
                best = up
        return best

    def _unavailable(self) -> UpstreamUnavailable:
        now = self.clock()
        back = min((u.ejected_until for u in self.upstreams), default=now) - now
        seconds = max(1, math.ceil(back))
        return UpstreamUnavailable(
            f"no healthy upstream for model {self.name!r}",
            headers=[(b"retry-after", str(seconds).encode("ascii"))],
        )

    # -- lifecycle and statistics ---------------------------------------------------------
    async def aclose(self) -> None:
        for up in self.upstreams:
            await up.aclose()

    def statistics(self) -> RelayStatistics:
        return RelayStatistics(
            model=self.name,
            requests=self.requests,
            retries=self.retries,
            unavailable=self.unavailable,
            unreachable=self.unreachable,
            timeouts=self.timeouts,
            client_disconnects=self.client_disconnects,
            refusals=self.refusals,
            estimated=self.estimated,
            upstreams={u.url.url: u.statistics() for u in self.upstreams},
        )


def _reports_usage(content_type: bytes | None) -> bool:
    """An answer that may carry OpenAI's ``usage`` (JSON, or a stream of JSON events)."""
    if content_type is None:
        return False
    ct = content_type.lower()
    return b"json" in ct or b"event-stream" in ct


def _is_event_stream(content_type: bytes | None) -> bool:
    return content_type is not None and b"event-stream" in content_type.lower()


def _whole(rhead: ResponseHead) -> bool:
    """A body read to its end before answering: delimited by the close, or small."""
    return rhead.framing is Framing.NONE or (
        rhead.framing is Framing.LENGTH
        and rhead.content_length is not None
        and rhead.content_length <= WHOLE_BODY_MAX_BYTES
    )


def _names_option(views: list[memoryview]) -> bool:
    """Whether an error body names the ``stream_options`` the relay added."""
    if not views:
        return False
    if len(views) == 1:
        return _NAMES_OPTION.search(views[0]) is not None
    body = b"".join(views)  # an error body cut by reads (at most WHOLE_BODY_MAX_BYTES)
    metrics.count_copy("relay_refusal", len(body))
    return _NAMES_OPTION.search(body) is not None


def api_key(options: RemoteOptions) -> str | None:
    env = options.api_key_env
    return os.environ.get(env) if env else None
