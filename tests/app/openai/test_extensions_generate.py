"""vLLM's sampling extensions on a model's own ``generate`` (docs/extensions.md):
``tinyllm``'s sampler honours ``ignore_eos``, ``min_tokens``, ``top_k``, ``min_p`` and
``repetition_penalty``; ``echo``'s ``generate`` honours none and refuses each with a
400 naming it. A real server process, the official ``openai`` SDK (the extensions in
``extra_body``, as benchmark clients send them).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from typing import Any

import openai
import pytest

from tests.support import ServerProcess, start_server

# tinyllm's answer to "len" at temperature 1 with seed 7 ends on its own after 24 tokens
# (found by trying seeds): ignore_eos must carry it on to max_tokens.
ENDS_EARLY = {"messages": [{"role": "user", "content": "len"}], "temperature": 1.0, "seed": 7}
# Greedy tinyllm on "str.split" falls into a loop ('"x x" and "x x" is a "x x"').
LOOPS = [{"role": "user", "content": "str.split"}]


@pytest.fixture(scope="module")
def srv() -> Iterator[ServerProcess]:
    server = start_server("--model", "tinyllm", "--model", "echo")
    yield server
    assert server.stop() == 0


@pytest.fixture(scope="module")
def client(srv: ServerProcess) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=srv.url + "/v1", api_key="x", max_retries=0) as c:
        yield c


def test_ignore_eos_gives_exactly_max_tokens(client: openai.OpenAI) -> None:
    free = client.chat.completions.create(model="tinyllm", max_tokens=48, **ENDS_EARLY)
    assert free.choices[0].finish_reason == "stop"
    assert free.usage is not None and free.usage.completion_tokens < 48
    fixed = client.chat.completions.create(
        model="tinyllm", max_tokens=48, extra_body={"ignore_eos": True}, **ENDS_EARLY
    )
    assert fixed.choices[0].finish_reason == "length"
    assert fixed.usage is not None and fixed.usage.completion_tokens == 48
    assert fixed.choices[0].message.content


def test_ignore_eos_streamed_as_benchmark_clients_ask(client: openai.OpenAI) -> None:
    # guidellm's shape: max_completion_tokens, ignore_eos, min_tokens and stop null,
    # streamed with the usage on every chunk; four choices, seeds 4 to 7.
    stream = client.chat.completions.create(
        model="tinyllm",
        max_completion_tokens=32,
        n=4,
        stream=True,
        stream_options={"include_usage": True, "continuous_usage_stats": True},  # type: ignore[typeddict-unknown-key]
        extra_body={"ignore_eos": True, "min_tokens": 32, "stop": None},
        messages=ENDS_EARLY["messages"],
        temperature=1.0,
        seed=4,
    )
    finish: dict[int, str] = {}
    usage = None
    for chunk in stream:
        for choice in chunk.choices:
            if choice.finish_reason is not None:
                finish[choice.index] = choice.finish_reason
        usage = chunk.usage or usage
    assert finish == dict.fromkeys(range(4), "length")
    assert usage is not None and usage.completion_tokens == 4 * 32


def test_top_k_one_and_min_p_one_equal_greedy(client: openai.OpenAI) -> None:
    kw: Any = {"model": "tinyllm", "max_tokens": 40, "messages": ENDS_EARLY["messages"]}
    greedy = client.chat.completions.create(temperature=0, **kw).choices[0].message.content
    assert greedy
    for extra in ({"top_k": 1}, {"min_p": 1.0}):
        answer = (
            client.chat.completions.create(temperature=1.0, seed=7, extra_body=extra, **kw)
            .choices[0]
            .message.content
        )
        assert answer == greedy, extra
    # A wider top_k at temperature 1 samples: the seed decides, so the answer is its own.
    wide = [
        client.chat.completions.create(temperature=1.0, seed=s, extra_body={"top_k": 50}, **kw)
        .choices[0]
        .message.content
        for s in (1, 2)
    ]
    assert wide[0] != wide[1]


def _repeats(text: str, n: int = 6) -> int:
    """Runs of ``n`` characters that occur again: how much a text loops."""
    grams = Counter(text[i : i + n] for i in range(len(text) - n + 1))
    return sum(k - 1 for k in grams.values())


def test_a_repetition_penalty_breaks_a_greedy_loop(client: openai.OpenAI) -> None:
    kw: Any = {"model": "tinyllm", "max_tokens": 96, "messages": LOOPS, "temperature": 0}
    loop = client.chat.completions.create(**kw).choices[0].message.content or ""
    penalised = (
        client.chat.completions.create(extra_body={"repetition_penalty": 1.3}, **kw)
        .choices[0]
        .message.content
        or ""
    )
    assert _repeats(loop) >= 20, loop
    assert penalised != loop
    assert _repeats(penalised) * 2 < _repeats(loop), penalised


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("top_k", 5),
        ("min_p", 0.2),
        ("repetition_penalty", 1.3),
        ("ignore_eos", True),
    ],
)
def test_a_generate_that_honours_none_refuses_each_by_name(
    client: openai.OpenAI, name: str, value: Any
) -> None:
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(
            model="echo",
            max_tokens=2,
            messages=LOOPS,
            extra_body={name: value},
        )
    body: Any = info.value.body
    assert body["param"] == name and body["type"] == "invalid_request_error"
    # The same extension on tinyllm is served.
    answer = client.chat.completions.create(
        model="tinyllm", max_tokens=2, messages=LOOPS, extra_body={name: value}
    )
    assert answer.choices[0].message.content is not None


def test_completions_honour_them_too(client: openai.OpenAI) -> None:
    done = client.completions.create(
        model="tinyllm",
        prompt="<|user|>\nlen\n<|assistant|>\n",
        max_tokens=48,
        temperature=1.0,
        seed=7,
        extra_body={"ignore_eos": True, "repetition_penalty": 1.1, "top_k": 40},
    )
    assert done.choices[0].finish_reason == "length"
    assert done.usage is not None and done.usage.completion_tokens == 48
