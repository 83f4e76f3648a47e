"""What each ``--endpoint`` sends, and how the tokens of its answer are counted.

* ``openai-chat``: ``POST /v1/chat/completions``, the prompt as one user message. Streamed,
  a token is an SSE chunk with non-empty ``choices[0].delta.content``; not streamed, the
  answer's ``usage.completion_tokens``.
* ``openai-completions``: ``POST /v1/completions``, the same with ``choices[0].text``.
* ``v2``: ``POST /v2/models/MODEL/infer``, the prompt as a one-element BYTES tensor
  ``INPUT0``. No tokens (``--stream`` is refused: V2 infer does not stream).
* ``raw``: ``POST /v1/raw/MODEL``, the prompt as the body. Streamed (``Accept:
  text/event-stream``, ``?max_tokens=N``), a token is one SSE event; not streamed, no
  tokens.

Counting is incremental (:class:`TokenCounter` is fed body pieces as they arrive), so
the arrival time of every token is known.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Literal

Endpoint = Literal["openai-chat", "openai-completions", "v2", "raw"]
ENDPOINTS: tuple[Endpoint, ...] = ("openai-chat", "openai-completions", "v2", "raw")
# Longest SSE event kept while waiting for its end (a broken server must not grow it).
MAX_EVENT_BYTES = 16 * 1024 * 1024


@dataclass(frozen=True)
class Plan:
    """The request of a run (one, sent again and again) and how to count its answer."""

    endpoint: Endpoint
    method: str
    path: str
    headers: dict[str, str]
    body: bytes
    stream: bool

    def request(self, host: str, extra: dict[str, str]) -> bytes:
        lines = [
            f"{self.method} {self.path} HTTP/1.1",
            f"Host: {host}",
            f"Content-Length: {len(self.body)}",
        ]
        lines += [f"{k}: {v}" for k, v in {**self.headers, **extra}.items()]
        return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + self.body


def plan(
    endpoint: Endpoint,
    base_path: str,
    model: str,
    prompt: str,
    max_tokens: int,
    stream: bool,
    ignore_eos: bool = False,
) -> Plan:
    """The request for ``endpoint`` under ``base_path`` (the URL's path, '' or '/api');
    ``ignore_eos``: vLLM's extension, every answer ``max_tokens`` long (OpenAI endpoints)."""
    base = base_path.rstrip("/").removesuffix("/v1")
    js = {"Content-Type": "application/json", "Accept": "application/json"}
    sse = {"Content-Type": "application/json", "Accept": "text/event-stream"}
    fixed: dict[str, Any] = {"ignore_eos": True} if ignore_eos else {}
    if ignore_eos and endpoint not in ("openai-chat", "openai-completions"):
        raise ValueError("--ignore-eos is for the OpenAI endpoints")
    if endpoint == "openai-chat":
        doc: dict[str, Any] = {
            "model": model,
            "max_tokens": max_tokens,
            "stream": stream,
            "messages": [{"role": "user", "content": prompt}],
            **fixed,
        }
        return Plan(
            endpoint,
            "POST",
            f"{base}/v1/chat/completions",
            sse if stream else js,
            json.dumps(doc).encode(),
            stream,
        )
    if endpoint == "openai-completions":
        doc = {"model": model, "max_tokens": max_tokens, "stream": stream, "prompt": prompt}
        doc.update(fixed)
        return Plan(
            endpoint,
            "POST",
            f"{base}/v1/completions",
            sse if stream else js,
            json.dumps(doc).encode(),
            stream,
        )
    if endpoint == "v2":
        if stream:
            raise ValueError("the v2 endpoint does not stream; drop --stream")
        doc = {"inputs": [{"name": "INPUT0", "datatype": "BYTES", "shape": [1], "data": [prompt]}]}
        return Plan(
            endpoint, "POST", f"{base}/v2/models/{model}/infer", js, json.dumps(doc).encode(), False
        )
    headers = {"Content-Type": "text/plain"}
    path = f"{base}/v1/raw/{model}"
    if stream:
        headers["Accept"] = "text/event-stream"
        path += f"?max_tokens={max_tokens}"
    return Plan(endpoint, "POST", path, headers, prompt.encode(), stream)


@dataclass
class TokenCounter:
    """Counts the tokens of one answer as its body pieces arrive."""

    plan: Plan
    token_times: list[float] = field(default_factory=list)
    usage_tokens: int | None = None  # what a non-streamed OpenAI answer reports
    _buf: bytearray = field(default_factory=bytearray)
    _body: bytearray = field(default_factory=bytearray)

    def feed(self, data: bytes, now: float) -> None:
        if not self.plan.stream:
            if self.plan.endpoint.startswith("openai"):
                self._body += data
            return
        self._buf += data
        if b"\r" in self._buf:
            self._buf[:] = self._buf.replace(b"\r\n", b"\n")
        while (end := self._buf.find(b"\n\n")) >= 0:
            event = bytes(self._buf[:end])
            del self._buf[: end + 2]
            self._event(event, now)
        if len(self._buf) > MAX_EVENT_BYTES:
            raise ValueError("an SSE event exceeds the size limit")

    def _event(self, event: bytes, now: float) -> None:
        data = b"\n".join(
            line[5:].removeprefix(b" ") for line in event.split(b"\n") if line.startswith(b"data:")
        )
        if not data and not event.startswith(b"data:"):
            return  # comments, keep-alives, other fields
        if self.plan.endpoint == "raw":
            self.token_times.append(now)
            return
        if data == b"[DONE]":
            return
        try:
            choices = json.loads(data).get("choices") or [{}]
            first = choices[0] or {}
            text = (
                (first.get("delta") or {}).get("content")
                if (self.plan.endpoint == "openai-chat")
                else first.get("text")
            )
        except (ValueError, AttributeError, TypeError):
            return
        if text:
            self.token_times.append(now)

    def finish(self) -> int:
        """The answer's token count (after the whole body was fed)."""
        if self.plan.stream:
            return len(self.token_times)
        if self._body:
            try:
                usage = json.loads(self._body).get("usage") or {}
                self.usage_tokens = int(usage.get("completion_tokens", 0))
            except (ValueError, AttributeError, TypeError):
                self.usage_tokens = 0
        return self.usage_tokens or 0
