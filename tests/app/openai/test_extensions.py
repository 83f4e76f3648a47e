"""vLLM's sampling extensions on chat completions and completions (docs/extensions.md):
``ignore_eos``, ``min_tokens``, ``top_k``, ``min_p``, ``repetition_penalty`` and
``stream_options.continuous_usage_stats``, honoured by llama.cpp's engine (``smollm2``)
and by ``tinyllm``'s sampler (its own tests: test_extensions_generate.py), relayed by a
``remote:`` model, refused with a 400 naming them by a ``generate`` that honours none
(``echo``).

The benchmark clients' request is sent as they send it: guidellm's synthetic chat
benchmark (``max_completion_tokens`` + ``ignore_eos`` + ``stop: null``, streamed with
``include_usage`` and ``continuous_usage_stats``; copied from guidellm 0.8's
``backends/openai/request_handlers.py``) through the official SDK's ``extra_body``, and
``zeroserve bench --ignore-eos``; each answer is exactly as long as asked.
"""

from __future__ import annotations

import json
import subprocess
import sys
import typing
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest

from tests.support import ROOT, ServerProcess, model_scaled, start_server
from zeroserve.app.chat.request import OPTIONAL_PARAMETERS
from zeroserve.app.openai.schemas import ModelCapabilities

pytest.importorskip("xllamacpp")

# Its smollm2 cases wait on the niced decode: pytest-timeout by model_slowdown
# (tests/conftest.py; docs/decisions/0055-model-waits-scaled-for-the-niced-share.md).
pytestmark = pytest.mark.niced

FRANCE = [{"role": "user", "content": "What is the capital of France?"}]
# guidellm's synthetic benchmark asks for this many output tokens by default here.
FIXED = 32
# The extensions, each at a value that changes the answer.
EXTENSIONS: dict[str, Any] = {
    "top_k": 5,
    "min_p": 0.2,
    "repetition_penalty": 1.3,
    "ignore_eos": True,
}


@pytest.fixture(scope="module")
def llm() -> Iterator[ServerProcess]:
    server = start_server(
        "--model", "smollm2?parallel=2&n_ctx=2048", "--model", "tinyllm", "--model", "echo"
    )
    yield server
    assert server.stop() == 0


@pytest.fixture(scope="module")
def gateway(llm: ServerProcess) -> Iterator[ServerProcess]:
    server = start_server("--model", f"gw=remote:{llm.url}/v1?upstream_model=smollm2")
    yield server
    assert server.stop() == 0


def _client(server: ServerProcess) -> openai.OpenAI:
    return server.client(timeout=model_scaled(120))


def _guidellm_body() -> dict[str, Any]:
    """The extra fields of guidellm's synthetic chat request (its stream and length)."""
    return {"ignore_eos": True, "stop": None}


@pytest.mark.parametrize("model", ["smollm2", "gw"])
def test_guidellm_stream_is_exactly_as_long_as_asked(
    llm: ServerProcess, gateway: ServerProcess, model: str
) -> None:
    server = gateway if model == "gw" else llm
    with _client(server) as client:
        stream = client.chat.completions.create(
            model=model,
            messages=FRANCE,  # type: ignore[arg-type]
            max_completion_tokens=FIXED,
            stream=True,
            stream_options={"include_usage": True, "continuous_usage_stats": True},  # type: ignore[typeddict-unknown-key]
            extra_body=_guidellm_body(),
        )
        chunks = list(stream)
    # Usage on every chunk, the completion's count never going back, the last the total.
    counts = [c.usage.completion_tokens for c in chunks if c.usage is not None]
    assert len(counts) == len(chunks)
    assert counts == sorted(counts)
    assert counts[-1] == FIXED
    assert all(c.usage is not None and c.usage.prompt_tokens > 0 for c in chunks)
    reasons = [ch.finish_reason for c in chunks for ch in c.choices if ch.finish_reason]
    assert reasons == ["length"]


def test_ignore_eos_runs_past_the_models_own_end(llm: ServerProcess) -> None:
    """Greedy SmolLM2 answers the question in a few tokens and stops; with ignore_eos
    the same request runs to max_tokens."""
    with _client(llm) as client:
        short = client.chat.completions.create(
            model="smollm2",
            messages=FRANCE,
            max_tokens=64,
            temperature=0,  # type: ignore[arg-type]
        )
        assert short.choices[0].finish_reason == "stop"
        assert short.usage is not None and short.usage.completion_tokens < 64
        long = client.chat.completions.create(
            model="smollm2",
            messages=FRANCE,  # type: ignore[arg-type]
            max_tokens=64,
            temperature=0,
            extra_body={"ignore_eos": True, "min_tokens": 64},
        )
        assert long.choices[0].finish_reason == "length"
        assert long.usage is not None and long.usage.completion_tokens == 64
        text = client.completions.create(
            model="smollm2",
            prompt="The capital of France is",
            max_tokens=FIXED,
            extra_body={"ignore_eos": True},
        )
        assert text.usage is not None and text.usage.completion_tokens == FIXED


def test_completions_stream_carries_usage_on_every_chunk(llm: ServerProcess) -> None:
    with httpx.stream(
        "POST",
        llm.url + "/v1/completions",
        json={
            "model": "smollm2",
            "prompt": "Once upon a time",
            "max_tokens": 8,
            "ignore_eos": True,
            "stream": True,
            "stream_options": {"include_usage": True, "continuous_usage_stats": True},
        },
        timeout=model_scaled(60),
    ) as r:
        assert r.status_code == 200
        events = [
            json.loads(line[6:])
            for line in r.iter_lines()
            if line.startswith("data: ") and line != "data: [DONE]"
        ]
    assert all(isinstance(e.get("usage"), dict) for e in events)
    assert events[-1]["usage"]["completion_tokens"] == 8


@pytest.mark.parametrize("name", sorted(EXTENSIONS))
def test_each_extension_is_honoured_by_the_engine_and_refused_by_generate(
    llm: ServerProcess, name: str
) -> None:
    for model, status in (("smollm2", 200), ("tinyllm", 200), ("echo", 400)):
        r = httpx.post(
            llm.url + "/v1/chat/completions",
            json={"model": model, "messages": FRANCE, "max_tokens": 2, name: EXTENSIONS[name]},
            timeout=model_scaled(60),
        )
        assert r.status_code == status, (model, r.text)
        if status == 400:
            assert r.json()["error"]["param"] == name


@pytest.mark.parametrize(
    ("extra", "param"),
    [
        ({"min_tokens": 2}, "min_tokens"),  # without ignore_eos
        ({"min_tokens": 2, "ignore_eos": True, "stop": ["x"]}, "min_tokens"),
        ({"min_tokens": 9, "ignore_eos": True}, "min_tokens"),  # above max_tokens
        ({"stream": True, "stream_options": {"continuous_usage_stats": True}},
         "stream_options.continuous_usage_stats"),
        ({"repetition_penalty": 0}, "repetition_penalty"),
        ({"min_p": 1.5}, "min_p"),
        ({"top_k": -2}, "top_k"),
    ],
)  # fmt: skip
def test_what_cannot_be_served_is_a_400_naming_it(
    llm: ServerProcess, extra: dict[str, Any], param: str
) -> None:
    r = httpx.post(
        llm.url + "/v1/chat/completions",
        json={"model": "smollm2", "messages": FRANCE, "max_tokens": 4, **extra},
        timeout=model_scaled(60),
    )
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param


def test_neutral_values_are_served_everywhere(llm: ServerProcess) -> None:
    """top_k -1 or 0 (every token), a repetition penalty of 1, min_p 0, ignore_eos false
    and min_tokens 0 change nothing, so a model that honours none of them serves them."""
    neutral = {
        "top_k": -1,
        "repetition_penalty": 1.0,
        "min_p": 0,
        "ignore_eos": False,
        "min_tokens": 0,
    }
    r = httpx.post(
        llm.url + "/v1/chat/completions",
        json={"model": "echo", "messages": FRANCE, "max_tokens": 2, **neutral},
        timeout=model_scaled(60),
    )
    assert r.status_code == 200, r.text


def test_the_card_lists_them_and_the_two_lists_agree(llm: ServerProcess) -> None:
    # ModelCapabilities.parameters is a Literal for the OpenAPI document: the same names,
    # in the same order, as the chat request's OPTIONAL_PARAMETERS.
    (literal,) = typing.get_args(typing.get_type_hints(ModelCapabilities)["parameters"])
    assert typing.get_args(literal) == OPTIONAL_PARAMETERS
    cards = {c["id"]: c["capabilities"] for c in httpx.get(llm.url + "/v1/models").json()["data"]}
    assert cards["smollm2"]["parameters"] == list(OPTIONAL_PARAMETERS)
    assert cards["tinyllm"]["parameters"] == [
        "top_k",
        "min_p",
        "repetition_penalty",
        "ignore_eos",
        "min_tokens",
    ]
    assert cards["echo"]["parameters"] == []


def test_zeroserve_bench_with_ignore_eos_gets_exact_lengths(llm: ServerProcess) -> None:
    out = subprocess.run(
        [sys.executable, "-m", "zeroserve", "bench", llm.url, "--model", "smollm2",
         "-c", "2", "-n", "4", "--max-tokens", str(FIXED), "--ignore-eos", "--json",
         "--timeout", str(model_scaled(60))],
        capture_output=True, text=True, timeout=model_scaled(300), cwd=ROOT, check=False,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    assert report["requests"] == {"sent": 4, "ok": 4, "errors": 0}
    assert report["output_tokens"] == 4 * FIXED
