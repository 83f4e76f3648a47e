"""The benchmark scenarios as data: what to send, how to check the answer.

A :class:`Case` is one measured configuration (a scenario at one body size or concurrency).
To add a scenario, write its cases with a request body, headers, a validator for one
response, and register them in :data:`SCENARIOS`; give every peer the endpoint it uses.
The runner starts each server fresh per case, checks one request with the validator (a
server that fails it is reported as unsupported for that case), then drives the load.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal

KiB = 1024
MiB = 1024 * KiB

# W2: 256 space-separated tokens give 256 SSE events per request.
W2_TOKENS = 256
W2_CONCURRENCY = (32, 256)

Kind = Literal["echo", "stream"]
# (status, lower-cased headers, response body) -> an error message, or None when right.
Validator = Callable[[int, dict[str, str], bytes], str | None]


@dataclass(frozen=True)
class Case:
    key: str  # stable id, e.g. "W1-64KiB"
    scenario: str  # "W1"
    label: str  # shown in tables
    kind: Kind
    path: str
    body: bytes
    headers: dict[str, str]
    connections: int
    validate: Validator
    events_per_request: int = 0  # for streams: tokens (events) per response
    probe_first_event: bool = False
    count_writes: bool = False
    in_quick: bool = True
    group: str = ""  # cases on one throughput-vs-concurrency curve
    min_duration_s: int = 1  # at least this much load, even in --quick
    extra: dict[str, object] = field(default_factory=dict)


def _echo_validator(body: bytes) -> Validator:
    def check(status: int, headers: dict[str, str], resp: bytes) -> str | None:
        if status != 200:
            return f"status {status}"
        if resp != body:
            return f"echo mismatch: sent {len(body)} bytes, got {len(resp)}"
        return None

    return check


def sse_events(resp: bytes) -> list[bytes]:
    """The ``data:`` payloads of an SSE body, in order."""
    out = []
    for event in resp.replace(b"\r\n", b"\n").split(b"\n\n"):
        for line in event.split(b"\n"):
            if line.startswith(b"data:"):
                out.append(line[5:].removeprefix(b" "))
    return out


def _sse_validator(tokens: list[bytes]) -> Validator:
    def check(status: int, headers: dict[str, str], resp: bytes) -> str | None:
        if status != 200:
            return f"status {status}"
        if "text/event-stream" not in headers.get("content-type", ""):
            return f"content-type {headers.get('content-type')!r}"
        events = sse_events(resp)
        if events != tokens:
            return f"expected {len(tokens)} events echoing the tokens, got {len(events)}"
        return None

    return check


def _openai_validator(tokens: list[str]) -> Validator:
    def check(status: int, headers: dict[str, str], resp: bytes) -> str | None:
        if status != 200:
            return f"status {status}"
        events = sse_events(resp)
        if not events or events[-1] != b"[DONE]":
            return "stream does not end with [DONE]"
        text = []
        for ev in events[:-1]:
            chunk = json.loads(ev)
            if chunk.get("object") != "text_completion":
                return f"chunk object {chunk.get('object')!r}"
            text += [c.get("text", "") for c in chunk.get("choices", [])]
        got = "".join(text).split()
        if got != tokens:
            return f"expected {len(tokens)} echoed tokens, got {len(got)}"
        return None

    return check


def chat_validator(max_tokens: int) -> Validator:
    def check(status: int, headers: dict[str, str], resp: bytes) -> str | None:
        if status != 200:
            return f"status {status}: {resp[:200]!r}"
        try:
            doc = json.loads(resp)
            content = doc["choices"][0]["message"]["content"]
        except (ValueError, KeyError, IndexError, TypeError) as exc:
            return f"not a chat completion: {exc}"
        if doc.get("object") != "chat.completion":
            return f"object {doc.get('object')!r}"
        if len(content.split()) != max_tokens:
            return f"expected {max_tokens} tokens, got {len(content.split())}"
        return None

    return check


def _w1() -> list[Case]:
    cases = []
    # (size, label, connections, minimum seconds: a slow peer needs ~2 s per 8 MiB echo at
    # 32 connections, so a shorter window completes no request at all)
    for size, label, conns, min_s in (
        (64 * KiB, "64 KiB", 32, 1),
        (1 * MiB, "1 MiB", 32, 1),
        (8 * MiB, "8 MiB", 32, 4),
    ):
        body = os.urandom(size)
        cases.append(
            Case(
                key=f"W1-{label.replace(' ', '')}",
                scenario="W1",
                label=f"{label} x{conns}",
                kind="echo",
                path="/v1/raw/echo",
                body=body,
                headers={"Content-Type": "application/octet-stream"},
                connections=conns,
                validate=_echo_validator(body),
                extra={"body_bytes": size},
                min_duration_s=min_s,
            )
        )
    return cases


def _w2() -> list[Case]:
    tokens = [f"tok{i:03d}".encode() for i in range(W2_TOKENS)]
    raw_body = b" ".join(tokens)
    prompt = raw_body.decode()
    openai_body = json.dumps(
        {
            "model": "echo",
            "prompt": prompt,
            "max_tokens": W2_TOKENS,
            "stream": True,
        }
    ).encode()
    cases = []
    for conns in W2_CONCURRENCY:
        cases.append(
            Case(
                key=f"W2-sse-c{conns}",
                scenario="W2",
                label=f"raw SSE x{conns}",
                kind="stream",
                path="/v1/raw/echo",
                body=raw_body,
                headers={"Content-Type": "text/plain", "Accept": "text/event-stream"},
                connections=conns,
                validate=_sse_validator(tokens),
                events_per_request=W2_TOKENS,
                probe_first_event=True,
                count_writes=True,
                in_quick=conns == W2_CONCURRENCY[0],
                group="raw SSE",
            )
        )
    for conns in W2_CONCURRENCY:
        cases.append(
            Case(
                key=f"W2-openai-c{conns}",
                scenario="W2",
                label=f"OpenAI chunks x{conns}",
                kind="stream",
                path="/v1/completions",
                body=openai_body,
                headers={"Content-Type": "application/json", "Accept": "text/event-stream"},
                connections=conns,
                validate=_openai_validator(prompt.split()),
                events_per_request=W2_TOKENS,
                probe_first_event=True,
                in_quick=False,
                group="OpenAI chunks",
            )
        )
    return cases


SCENARIOS: dict[str, Callable[[], list[Case]]] = {"W1": _w1, "W2": _w2}
DEFAULT_SCENARIOS = ("W1", "W2")


def cases_for(names: list[str], quick: bool) -> list[Case]:
    out: list[Case] = []
    for name in names:
        if name not in SCENARIOS:
            raise ValueError(f"unknown scenario {name!r}; known: {', '.join(SCENARIOS)}")
        out += [c for c in SCENARIOS[name]() if c.in_quick or not quick]
    return out
