"""Hostile raw requests (query strings, timeout headers, Accept), through the real
server: always a 2xx or an OpenAI-format 4xx, never a 5xx, nothing left held."""

from __future__ import annotations

from hypothesis import example, given
from hypothesis import strategies as st

from tests.fuzz import strategies as fs
from tests.fuzz.checks import assert_answer
from tests.fuzz.conftest import Target


def _sendable(value: str) -> bool:
    """A header value the client can put on the wire (h11 refuses surrounding whitespace
    and control characters; raw bytes on the socket are the h1 tests' job)."""
    return value == value.strip(" \t") and all(" " <= c <= "~" for c in value)


_HEADERS = st.fixed_dictionaries(
    {},
    optional={
        "accept": st.sampled_from(["text/event-stream", "*/*", "application/octet-stream"]),
        "request-timeout": st.one_of(fs._query_value.filter(_sendable), st.just("1")),
    },
)


@given(
    query=fs.raw_queries(),
    headers=_HEADERS,
    body=st.binary(max_size=64),
    model=st.sampled_from(["echo", "echo-thread"]),
)
# Found by the fuzzer: an echoed SSE piece that reads like the start of an error event
# is the model's data, not ours (the check once tried to parse it as JSON).
@example(query="", headers={"accept": "text/event-stream"}, body=b'{"error"', model="echo")
def test_raw_requests(
    target: Target, query: str, headers: dict[str, str], body: bytes, model: str
) -> None:
    r = target.send("POST", f"/v1/raw/{model}?{query}", body, headers=headers)
    timed = "timeout" in query or "request-timeout" in headers
    assert_answer(target, r, "openai", timed=timed)
