"""The harness's bounded asyncio client for chat streams (SSE over HTTP/1.1): OpenAI's
chat chunks, or Anthropic's Messages events. N workers open streams back to back, one
fresh connection each, and count content tokens the time to the first one and the gaps
between the next ones."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from dataclasses import dataclass, field

from .procs import LOOPBACK

# One stream may take at most this long; the whole run, its window plus this.
STREAM_TIMEOUT_S = 60.0


@dataclass
class StreamStats:
    """Tokens and streams inside the window, failures, and the TTFT and inter-token
    samples (a gap is between two content chunks of one stream, as the client read them:
    chunks that arrive in one read are 0 ms apart)."""

    tokens: int = 0
    streams: int = 0
    failures: int = 0
    ttft_ms: list[float] = field(default_factory=list)
    itl_ms: list[float] = field(default_factory=list)
    duration_s: float = 0.0
    errors: list[str] = field(default_factory=list)


# What ends a stream: OpenAI's last event, Anthropic's.
ENDS = (b"[DONE]", b'{"type":"message_stop"}')


def count_tokens(event: bytes) -> int:
    """1 if an OpenAI chat chunk carries non-empty content, or an Anthropic event is a
    non-empty ``text_delta``, else 0."""
    if event in ENDS:
        return 0
    try:
        data = json.loads(event)
        if data.get("type") == "content_block_delta":
            delta = data.get("delta") or {}
            return 1 if delta.get("type") == "text_delta" and delta.get("text") else 0
        choices = data.get("choices") or [{}]
        return 1 if (choices[0].get("delta") or {}).get("content") else 0
    except (ValueError, AttributeError):
        return 0


async def _one_stream(port: int, request: bytes, stats: StreamStats, window_end: float) -> None:
    """One streaming request on a fresh connection: time to the first content token and
    between the next ones, tokens received before ``window_end``."""
    t0 = time.perf_counter()
    reader, writer = await asyncio.open_connection(LOOPBACK, port)
    try:
        writer.write(request)
        head = await reader.readuntil(b"\r\n\r\n")
        status = head.split(b" ", 2)[1]
        if status != b"200":
            raise ConnectionError(f"status {status.decode()}")
        chunked = b"transfer-encoding: chunked" in head.lower()
        buf = b""
        last = 0.0  # when the previous content chunk arrived; 0 before the first
        while True:
            if chunked:
                size = int((await reader.readline()).split(b";")[0], 16)
                data = await reader.readexactly(size + 2)
                data = data[:-2]
                if size == 0:
                    break
            else:
                data = await reader.read(65536)
                if not data:
                    break
            buf += data
            *events, buf = buf.replace(b"\r\n", b"\n").split(b"\n\n")
            now = time.perf_counter()
            for ev in events:
                for line in ev.split(b"\n"):
                    if not line.startswith(b"data:"):
                        continue
                    payload = line[5:].strip()
                    n = count_tokens(payload)
                    if n:
                        if last:
                            stats.itl_ms.append((now - last) * 1000)
                        else:
                            stats.ttft_ms.append((now - t0) * 1000)
                        last = now
                    if now <= window_end:
                        stats.tokens += n
                    if payload in ENDS:
                        if now <= window_end:
                            stats.streams += 1
                        return
    finally:
        writer.close()
        with contextlib.suppress(OSError):
            await writer.wait_closed()


async def stream_load(
    port: int, path: str, body: bytes, concurrency: int, duration_s: float
) -> StreamStats:
    """``concurrency`` workers, each opening streams back to back for ``duration_s``;
    every stream bounded by STREAM_TIMEOUT_S, the whole run by duration plus that."""
    request = (
        f"POST {path} HTTP/1.1\r\nHost: {LOOPBACK}\r\nContent-Type: application/json\r\n"
        f"Accept: text/event-stream\r\nConnection: close\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    ).encode() + body
    stats = StreamStats()
    start = time.perf_counter()
    end = start + duration_s

    async def worker() -> None:
        while time.perf_counter() < end:
            try:
                await asyncio.wait_for(_one_stream(port, request, stats, end), STREAM_TIMEOUT_S)
            except (TimeoutError, OSError, ValueError, asyncio.IncompleteReadError) as e:
                stats.failures += 1
                if len(stats.errors) < 3:
                    stats.errors.append(f"{type(e).__name__}: {e}")

    tasks = [asyncio.create_task(worker()) for _ in range(concurrency)]
    await asyncio.wait(tasks, timeout=duration_s + STREAM_TIMEOUT_S + 5)
    for t in tasks:
        t.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    stats.duration_s = duration_s
    return stats
