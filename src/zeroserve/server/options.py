"""Server options: timeouts and connection limits, each a named constant with its reason."""

from __future__ import annotations

from dataclasses import dataclass, field

from ..http.limits import HttpLimits

# Seconds to receive a complete request head, counted from its first byte (or from the
# connection's start for its first request). Defeats slow-loris; nginx allows 60 s, but a
# head is a few hundred bytes and no honest client needs more than a few seconds.
HEAD_TIMEOUT_S = 10.0
# Seconds without a single body byte before a partly sent body is abandoned (nginx's
# client_body_timeout is 60 s between reads; we are stricter, bodies go to a model).
BODY_TIMEOUT_S = 30.0
# Seconds an idle keep-alive connection is kept. Longer than the idle time of the clients
# in front of us, so that they, not we, close an idle connection: otherwise a request they
# send on it as we close it is lost (the keep-alive race; a POST is not retried, nginx
# answers 502). nginx keeps upstream connections 60 s (``keepalive_timeout``), AWS ALB 60 s,
# httpx (the openai SDK) 5 s; 75 s is nginx's own client default. uvicorn's 5 s races
# every one of them. Idle connections cost a head buffer each, bounded by
# MAX_CONNECTIONS: at the limit the longest-idle one is closed for a new client.
KEEPALIVE_TIMEOUT_S = 75.0
# Seconds a client may leave our send buffer full without reading before we drop it
# (nginx send_timeout is 60 s). Bounds how long a stalled reader pins a stream.
WRITE_TIMEOUT_S = 60.0
# Seconds in-flight requests get to finish after SIGTERM/SIGINT before connections close.
GRACEFUL_TIMEOUT_S = 30.0
# Seconds between SIGTERM and closing the listener. During it /ready answers 503 while
# new connections are still served, so a load balancer (or Kubernetes' endpoints
# controller) sees "not ready" and stops sending before connections are refused. 0 closes
# at once; behind a balancer set it to its health-check interval times its threshold.
DRAIN_READY_DELAY_S = 0.0
# Open connections per HTTP process. A new connection past it closes the longest-idle
# keep-alive connection (as nginx reuses its idle ones), or, with none idle, gets a 503
# and is closed. Each costs a 16 KiB head buffer plus kernel socket buffers.
MAX_CONNECTIONS = 4096
# Transport write buffer watermarks, bytes. Above HIGH the writer stops producing (the
# streaming backpressure); it resumes once the kernel took everything (LOW 0), which is
# also when leases referenced by the transport are released.
WRITE_HIGH_WATER = 256 * 1024
WRITE_LOW_WATER = 0
# Stream writer: at most this many pieces or bytes are gathered before a write and a
# yield to the loop, so a producer that never awaits cannot starve other connections.
# Each write costs a syscall (and, on loopback, the receiver's TCP work), so fewer, larger
# batches cut the CPU per stream; a new stream's first batch leaves at once from the I/O
# callback (StreamWriter.start), so its first event does not wait for a loop iteration.
# Measured on W2 raw SSE (32 streams of 256 tokens, server CPU from /proc): 32 pieces
# 0.33 CPU-ms per stream, new-client first event p99 23-30 ms; 128 pieces 0.20-0.23
# CPU-ms, p99 10-19 ms; 256 (a whole stream per step) 0.20 CPU-ms but p99 44-69 ms,
# since every loop iteration then runs every stream to its end.
STREAM_BATCH_PIECES = 128
STREAM_BATCH_BYTES = 64 * 1024
# Seconds of stream writing one loop iteration may run before further batches wait for a
# later iteration (server/turns.py): the loop polls for new connections and heads between
# iterations, so this bounds how long a new client waits behind the running streams
# (about two iterations to its first event) without shrinking any batch. A deferred
# batch costs a future and an iteration a poll. First tuned with server and load sharing
# one core (a benchmark harness bug): there 2 ms cost 15-20 % more CPU per stream and
# 4 ms 6 %. Retuned with the server on its own core, two W2 runs of 1 ms against 4 ms
# (interleaved rounds, each tree first in one run): new client's first event at 256 raw
# SSE streams p50 6-7 against 46 ms, p99 26-35 against 78-94 ms; 256 OpenAI streams p50
# 20-27 against 55-70 ms, p99 122-137 against 149-161 ms; at 32 streams p99 level to
# 30 % lower; tokens/s and CPU per stream level within the rounds' noise. Timed in
# wall-clock time, a preempted batch counts as long, so a loaded machine defers more
# than a quiet one.
# The budget bounds only the deferrable batches: stream starts (from I/O callbacks), task
# steps and request handling are not charged to it and grow with the iteration, so under
# saturating OpenAI streams an iteration ran 3-5 ms (time-weighted) at 1 ms, about 2 ms at
# 0.5 ms. W2 at 0.5 against 1 ms (3 interleaved rounds a run, compiled): new client's first
# event p99 10.7, 9.95 and 9.39 ms in three runs against 14.0 and 12.5 ms in two (OpenAI
# x32), 36.5, 55.7 and 34.7 against 103 and 89 ms (OpenAI x256); tokens/s 0.88x-1.13x the
# 1 ms tree's, within the rounds' noise (BENCHMARKS.md, W2). 0.25 ms cost raw SSE x32
# 0.83x its tokens/s in 30 paired slices.
TURN_BUDGET_S = 0.0005


@dataclass(frozen=True, slots=True)
class TlsOptions:
    """Certificate chain and key (PEM); ``ca_certs`` set: clients must present a
    certificate signed by one of them (mTLS)."""

    certfile: str
    keyfile: str | None = None
    ca_certs: str | None = None


@dataclass(frozen=True, slots=True)
class ServerOptions:
    host: str = "127.0.0.1"
    port: int = 8000
    http: HttpLimits = field(default_factory=HttpLimits)
    head_timeout: float = HEAD_TIMEOUT_S
    body_timeout: float = BODY_TIMEOUT_S
    keepalive_timeout: float = KEEPALIVE_TIMEOUT_S
    write_timeout: float = WRITE_TIMEOUT_S
    graceful_timeout: float = GRACEFUL_TIMEOUT_S
    max_connections: int = MAX_CONNECTIONS
    backlog: int = 2048
    reuse_port: bool = False
    drain_ready_delay: float = DRAIN_READY_DELAY_S
    tls: TlsOptions | None = None
    turn_budget_s: float = TURN_BUDGET_S

    @property
    def tick(self) -> float:
        """How often timeouts are checked: fine enough for the smallest timeout."""
        smallest = min(
            self.head_timeout, self.body_timeout, self.keepalive_timeout, self.write_timeout
        )
        return max(0.02, min(1.0, smallest / 4))
