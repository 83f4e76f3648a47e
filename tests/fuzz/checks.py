"""The one property of the fuzz suite: any input is answered 2xx, or 4xx with a body in
the API's own format; never 5xx, never a logged exception, and nothing is left held."""

from __future__ import annotations

import json
import time
from typing import Literal

import httpx

from tests.fuzz.conftest import Target

Format = Literal["openai", "kserve"]


def assert_answer(t: Target, r: httpx.Response, fmt: Format, *, timed: bool = False) -> None:
    """``timed``: the request may have asked for its own (maybe tiny) timeout, so a 504
    that says so is the right answer."""
    status = r.status_code
    if timed and status == 504:
        assert "deadline" in r.text, r.text
        status = 400  # then checked like any other refusal
    assert status < 500, f"{status}: {r.text[:500]}"
    if status >= 400:
        doc = r.json()
        assert set(doc) == {"error"}, doc
        if fmt == "kserve":
            assert isinstance(doc["error"], str)
        else:
            err = doc["error"]
            assert set(err) == {"message", "type", "param", "code"}, err
            assert isinstance(err["message"], str) and isinstance(err["code"], str)
    elif r.headers.get("content-type", "").startswith("text/event-stream"):
        # A stream that failed after its head ends with an error event: it must be one of
        # ours (a 4xx-class or a deadline), never an internal error.
        for line in r.text.splitlines():
            if not (line.startswith("data: {") and '"error"' in line):
                continue
            try:
                event = json.loads(line[6:])
            except json.JSONDecodeError:
                # Not one of ours, which are JSON documents: a raw stream's own data (an
                # echo of a body like b'{"error"' is the model's piece, sent as it is).
                continue
            if not isinstance(event, dict):
                continue
            # Chat and completions: {"error": {...}}; the Responses API: {"type": "error",
            # "code": ...}. Other events may hold an ``"error": null`` of their own.
            err = event if event.get("type") == "error" else event.get("error")
            if isinstance(err, dict):
                assert err["code"] != "internal_error", err
                assert timed or err["code"] != "deadline_exceeded", err
    logged = t.errors.take()
    assert not logged, "\n".join(logged)
    deadline = time.monotonic() + t.idle_wait_s
    while not t.idle():
        assert time.monotonic() < deadline, "a lease, ticket or stream was left held"
        time.sleep(0.001)
