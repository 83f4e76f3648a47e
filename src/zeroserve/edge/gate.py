"""The edge at a request's head: request id, CORS, API key, quota; and its end: the
access-log record and the release of the key's quota.

Strategy
--------
The I/O layer calls ``start()`` for every head (it never raises), then ``admit()``
before routing and before any body byte is read (it raises ``Unauthorized`` or
``RateLimited``), and ``finish()`` exactly once when the response is done or the
connection is gone. Everything is decided from the head's method, path, query and
headers, so the edge is driven by plain values in its tests. With nothing configured
``start()`` only takes the request id and ``admit()`` returns at once.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Final

from .. import metrics
from .access_log import AccessLog, AccessRecord, Outcome
from .cors import CorsPolicy, is_preflight
from .keys import ApiKey, KeyRing, refuse_query_key
from .options import METRICS_PATH, OPEN_PATHS, EdgeOptions
from .quotas import KeyQuota, QuotaStatistics
from .request_id import HEADER as REQUEST_ID_HEADER
from .request_id import RequestIds
from .tracing import RequestTrace, Tracing

Headers = list[tuple[bytes, bytes]]
HeaderList = Sequence[tuple[bytes, bytes]]

# The request headers the edge reads.
_READ: Final = frozenset((b"x-request-id", b"origin", b"authorization", b"api-key", b"x-api-key"))
Clock = Callable[[], float]


class EdgeContext:
    """What the edge decided for one request. ``headers`` go on its response (any
    response, errors included); ``preflight`` means: answer 204 with them and stop.
    ``quota`` is the key's quota this request holds (admitted, not yet ended): the context
    owns that hold, and ``Edge.finish`` releases it once."""

    __slots__ = (
        "_auth",
        "_clock",
        "_other_key",
        "bytes_out",
        "counting",
        "failed",
        "headers",
        "key",
        "load_wait_s",
        "model",
        "preflight",
        "quota",
        "request_id",
        "started",
        "status",
        "tokens",
        "trace",
        "ttft_s",
    )

    def __init__(self, request_id: bytes, headers: Headers, clock: Clock) -> None:
        self.request_id = request_id
        self.headers = headers
        self._clock = clock
        self.started = clock()
        self.preflight = False
        # What the response did, filled in by the server as it writes it.
        self.status = 0
        self.bytes_out = 0
        self.failed: Outcome | None = None  # a stream that failed after its head
        # Credential header values, taken in start()'s one pass over the headers.
        self._auth: bytes | None = None
        self._other_key: bytes | None = None
        self.key: ApiKey | None = None
        self.quota: KeyQuota | None = None
        self.model: str | None = None
        self.tokens = 0
        self.ttft_s: float | None = None
        # How long the request waited for its model to load (autoload), if it did.
        self.load_wait_s: float | None = None
        self.trace: RequestTrace | None = None  # spans, when tracing is on
        # Whether the tokens are used (a key's quota, the access log, a span): work done
        # only to count them (reading a relayed answer's usage) is skipped otherwise.
        self.counting = False

    @property
    def key_name(self) -> str | None:
        return self.key.name if self.key is not None else None

    def response_headers(self, headers: Headers) -> Headers:
        """A response's headers plus the edge's (request id, CORS, rate limits). Never
        mutates ``headers``: responses may be shared constants."""
        return [*headers, *self.headers] if self.headers else headers

    def first_piece(self) -> None:
        """A stream's first piece is going out: its TTFT, and the trace's stream phase."""
        self.ttft_s = self._clock() - self.started
        if self.trace is not None:
            self.trace.enter("stream")

    def load_waiting(self) -> float:
        """The request waits for its model's load: the trace's ``model_load`` phase
        begins. Returns when, for ``load_waited``."""
        if self.trace is not None:
            self.trace.enter("model_load")
        return self._clock()

    def load_waited(self, since: float) -> None:
        """The wait that began at ``since`` ended (loaded or not): its length goes to the
        access log and the trace, and the request's execution goes on."""
        self.load_wait_s = self._clock() - since
        if self.trace is not None:
            self.trace.enter("execution")

    def upstream_headers(self) -> Headers:
        """What a gateway upstream is told: this request's id and trace context."""
        out: Headers = [(REQUEST_ID_HEADER, self.request_id)] if self.request_id else []
        if self.trace is not None:
            out += self.trace.upstream_headers()
        return out

    def count_tokens(self, n: int) -> None:
        """Tokens the model counted (prompt, then each completion piece): debited from the
        key's tokens-per-minute as they are produced."""
        self.tokens += n
        if self.quota is not None:
            self.quota.debit_tokens(n)


@dataclass(slots=True)
class EdgeEnd:
    """How a request ended, for ``Edge.finish``: ``outcome`` None means "as its status
    says" (``outcome_of``); the status and the bytes sent are on the context."""

    method: str
    path: str
    outcome: Outcome | None = None
    bytes_in: int = 0


def outcome_of(status: int) -> Outcome:
    if status == 504:
        return "deadline"
    if status in (401, 429, 503):
        return "rejected"
    return "error" if status >= 500 else "done"


class Edge:
    """The configured edge (see ``EdgeOptions``). ``clock`` drives quotas and durations
    (monotonic seconds); ``wall`` stamps log records (epoch seconds)."""

    def __init__(
        self,
        options: EdgeOptions | None = None,
        *,
        clock: Clock = time.monotonic,
        wall: Clock = time.time,
        access_log: AccessLog | None = None,
        tracing: Tracing | None = None,
    ) -> None:
        self.options = opts = options or EdgeOptions()
        self.clock = clock
        self._wall = wall
        self._ids = RequestIds() if opts.request_ids else None
        self.keys = KeyRing(opts.keys) if opts.keys else None
        self._quotas = {k.name: KeyQuota(k, clock) for k in opts.keys}
        # The quotas in the key ring's order: ``KeyRing.find`` gives the index.
        self._quota_at = (
            tuple(self._quotas[k.name] for k in self.keys.keys) if self.keys is not None else ()
        )
        self.cors = (
            CorsPolicy(opts.cors_origins, allow_credentials=opts.cors_allow_credentials)
            if opts.cors_origins
            else None
        )
        if access_log is None and opts.access_log is not None:
            access_log = AccessLog(opts.access_log)
        self.access_log = access_log
        if access_log is not None:
            log = access_log
            metrics.register_source(
                "access_log",
                lambda: {"records": log.written, "dropped": log.dropped, "failed": log.failed},
                counters=("records", "dropped", "failed"),
            )
        self._open_paths = OPEN_PATHS if opts.auth_metrics else OPEN_PATHS | {METRICS_PATH}
        if tracing is None and opts.tracing:
            tracing = Tracing()
        self.tracing = tracing
        # Whether finish() has anything to do (a quota's hold, a log line, a span), and
        # whether it writes a record (a log line or a span); with keys alone it only
        # releases the quota.
        self.records = bool(self.access_log or self.tracing)
        self.needs_end = bool(self.keys) or self.records
        if self._quotas:
            metrics.register_source("api_key", self.statistics, counters=_KEY_COUNTERS, label="key")

    def start(self, method: str, headers: HeaderList, path: str = "") -> EdgeContext:
        """Request id, CORS headers and (tracing on) the server span for a new head.
        Never raises."""
        client_id = origin = auth = other = None
        for name, value in headers:  # one pass for everything the edge reads
            if name not in _READ:  # most headers: one set lookup
                continue
            if name == b"x-request-id":
                client_id = value
            elif name == b"origin":
                origin = value
            elif name == b"authorization":
                if auth is None:
                    auth = value
            elif other is None:  # api-key, x-api-key
                other = value
        out: Headers = []
        request_id = b""
        if self._ids is not None:
            request_id = self._ids.take(client_id)
            out.append((REQUEST_ID_HEADER, request_id))
        ctx = EdgeContext(request_id, out, self.clock)
        ctx.counting = self.needs_end
        ctx._auth = auth
        ctx._other_key = other
        if self.tracing is not None:
            ctx.trace = self.tracing.start(method, path, headers)
            self.tracing.phase(ctx.trace, "admission")
        cors = self.cors
        if cors is not None and origin is not None:
            if is_preflight(method, headers):
                ctx.preflight = True
                out += cors.preflight(origin)
            else:
                out += cors.simple(origin)
        return ctx

    def admit(self, ctx: EdgeContext, path: str, query: str) -> None:
        """API key (from the headers ``start`` saw) and quota, before routing. Raises
        ``Unauthorized`` / ``RateLimited``."""
        keys = self.keys
        if keys is None or path in self._open_paths:
            return
        if query:
            refuse_query_key(query)
        quota = self._quota_at[keys.find(ctx._auth, ctx._other_key)]
        ctx.key = quota.key
        quota.admit()
        ctx.quota = quota
        if quota.limited:
            ctx.headers += quota.headers()

    def phase(self, ctx: EdgeContext, name: str | None, route: str | None = None) -> None:
        """The request entered phase ``name`` (a child span; None ends the open one).
        ``route`` renames the server span to its low-cardinality route pattern. Callers
        check ``ctx.trace`` first, so with tracing off this is never called."""
        tracing, rt = self.tracing, ctx.trace
        if tracing is None or rt is None:
            return
        if route is not None:
            tracing.routed(rt, route)
        tracing.phase(rt, name)

    def finish(self, ctx: EdgeContext, end: EdgeEnd) -> None:
        """The request ended (sent, refused, or the client left): release the key's quota
        and write the access-log record. Called once per context."""
        if not self.needs_end:
            return
        self.release_quota(ctx)
        if self.access_log is None and ctx.trace is None:
            return
        outcome = ctx.failed or end.outcome or outcome_of(ctx.status)
        rt, ctx.trace = ctx.trace, None
        if rt is not None and self.tracing is not None:
            self.tracing.finish(
                rt,
                ctx.status,
                outcome,
                {
                    "zeroserve.request_id": ctx.request_id.decode("ascii"),
                    "zeroserve.model": ctx.model,
                    "zeroserve.api_key": ctx.key_name,
                    "zeroserve.tokens": ctx.tokens or None,
                    "zeroserve.load_wait_s": ctx.load_wait_s,
                },
            )
        log = self.access_log
        if log is not None:
            log.log(
                AccessRecord(
                    time=self._wall(),
                    request_id=ctx.request_id.decode("ascii"),
                    method=end.method,
                    path=end.path,
                    status=ctx.status,
                    outcome=outcome,
                    duration_s=round(self.clock() - ctx.started, 6),
                    bytes_in=end.bytes_in,
                    bytes_out=ctx.bytes_out,
                    model=ctx.model,
                    key=ctx.key_name,
                    ttft_s=None if ctx.ttft_s is None else round(ctx.ttft_s, 6),
                    tokens=ctx.tokens or None,
                    load_wait_s=None if ctx.load_wait_s is None else round(ctx.load_wait_s, 6),
                )
            )

    def release_quota(self, ctx: EdgeContext) -> None:
        """Drop the request's hold on its key's concurrency (once: the context forgets the
        quota): all ``finish`` does when the edge writes no record (keys without an access
        log or tracing), which the server calls directly then, without an ``EdgeEnd``."""
        quota, ctx.quota = ctx.quota, None
        if quota is not None:
            quota.release()

    def quota(self, name: str) -> KeyQuota:
        return self._quotas[name]

    def statistics(self) -> dict[str, QuotaStatistics]:
        return {name: q.statistics() for name, q in self._quotas.items()}

    def close(self) -> None:
        if self._quotas:
            metrics.unregister_source("api_key")
        if self.access_log is not None:
            metrics.unregister_source("access_log")
            self.access_log.close()


# Cumulative fields of QuotaStatistics (exported as *_total counters).
_KEY_COUNTERS = frozenset(
    {
        "requests",
        "tokens",
        "rejected",
        "rejected_concurrency",
        "rejected_requests",
        "rejected_tokens",
    }
)
