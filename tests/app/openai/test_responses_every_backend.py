"""One chat path: the Responses API is a front end over every backend. The official
``openai`` SDK asks ``tinyllm`` (a model's own ``generate``), ``smollm2`` (llama.cpp's
engine) and a ``remote:`` model (relayed to an upstream zeroserve that serves tinyllm),
whole and streamed, of real servers on loopback."""

from __future__ import annotations

from collections.abc import Iterator

import openai
import pytest

from tests.support import ServerProcess, start_server
from tests.support.smollm2 import require_llamacpp, smollm2_arg

require_llamacpp()

# Its smollm2 cases wait on the niced decode: pytest-timeout by model_slowdown
# (tests/conftest.py; docs/decisions/0055-model-waits-scaled-for-the-niced-share.md).
pytestmark = pytest.mark.niced


@pytest.fixture(scope="module")
def upstream() -> Iterator[ServerProcess]:
    server = start_server("--model", "tinyllm", "--model", smollm2_arg())
    yield server
    assert server.stop() == 0


@pytest.fixture(scope="module")
def gateway(upstream: ServerProcess) -> Iterator[ServerProcess]:
    server = start_server("--model", f"far=remote:{upstream.url}/v1?upstream_model=tinyllm")
    yield server
    assert server.stop() == 0


def _client(server: ServerProcess) -> openai.OpenAI:
    return server.client()


@pytest.mark.parametrize("model", ["tinyllm", "smollm2", "far"])
def test_responses_whole_and_streamed(
    upstream: ServerProcess, gateway: ServerProcess, model: str
) -> None:
    client = _client(gateway if model == "far" else upstream)
    kw = {"model": model, "input": "for", "max_output_tokens": 8, "temperature": 0}
    whole = client.responses.create(**kw)  # type: ignore[call-overload]
    assert whole.status == "incomplete"  # cut by max_output_tokens
    assert whole.incomplete_details is not None
    assert whole.incomplete_details.reason == "max_output_tokens"
    assert whole.output_text and whole.usage is not None and whole.usage.output_tokens == 8
    # A relayed answer comes back as the upstream wrote it (docs/gateway.md).
    assert whole.model == ("tinyllm" if model == "far" else model)

    events = list(client.responses.create(stream=True, **kw))  # type: ignore[call-overload]
    kinds = [e.type for e in events]
    assert kinds[:4] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
    ]
    assert kinds[-1] == "response.incomplete"
    assert [e.sequence_number for e in events] == list(range(len(events)))
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert text == whole.output_text  # greedy: the same answer streamed
    assert events[-1].response.output_text == text


def test_a_parameter_a_backend_cannot_honour_is_named_as_the_api_spells_it(
    upstream: ServerProcess,
) -> None:
    """``text.format`` JSON on tinyllm: its ``generate`` has no grammar, so the 400 names
    the Responses API's own parameter, not the chat request's."""
    with pytest.raises(openai.BadRequestError) as info:
        _client(upstream).responses.create(
            model="tinyllm", input="x", text={"format": {"type": "json_object"}}
        )
    assert info.value.param == "text.format"
