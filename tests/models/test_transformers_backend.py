"""The transformers backend on a tiny random-init Llama built here (no download): the
model API directly, then ``zeroserve serve --model NAME=transformers:/folder`` with the
openai SDK."""

from __future__ import annotations

import re
import signal
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

import openai

from tests.support import scaled, serve_argv
from zeroserve.models.base import GenerateRequest
from zeroserve.models.tinyllm import MODEL_DIR
from zeroserve.models.transformers_backend import TransformersModel

pytestmark = pytest.mark.backend

START_TIMEOUT_S = scaled(120.0)
TEMPLATE = (
    "{% for m in messages %}[{{ m['role'] }}] {{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}[assistant] {% endif %}"
)


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    path = tmp_path_factory.mktemp("tiny-llama")
    tok = PreTrainedTokenizerFast(
        tokenizer_file=str(MODEL_DIR / "tokenizer.json"), eos_token="<|endoftext|>"
    )
    tok.chat_template = TEMPLATE
    tok.save_pretrained(path)
    config = LlamaConfig(
        vocab_size=len(tok),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=2,
        max_position_embeddings=256,
        eos_token_id=tok.eos_token_id,
        bos_token_id=tok.eos_token_id,
    )
    torch.manual_seed(0)
    LlamaForCausalLM(config).save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def model(folder: Path) -> TransformersModel:
    m = TransformersModel(location=str(folder))
    m.load()
    return m


def run(model: TransformersModel, **kw: object) -> tuple[list[str], str]:
    gen = model.generate(GenerateRequest(**kw))  # type: ignore[arg-type]
    pieces: list[str] = []
    try:
        while True:
            pieces.append(next(gen))
    except StopIteration as done:
        return pieces, done.value


def test_streams_token_by_token_and_is_deterministic(model: TransformersModel) -> None:
    pieces, reason = run(model, prompt="The for statement", max_tokens=20, temperature=0.0)
    assert reason in ("stop", "length")
    assert len(pieces) > 1
    again, _ = run(model, prompt="The for statement", max_tokens=20, temperature=0.0)
    assert again == pieces
    a, _ = run(model, prompt="x", max_tokens=12, temperature=1.0, seed=4)
    b, _ = run(model, prompt="x", max_tokens=12, temperature=1.0, seed=4)
    assert a == b
    assert model.context_length == 256


def test_greedy_matches_transformers_generate(model: TransformersModel) -> None:
    import torch

    hf, tok = model._loaded()
    ids = tok("The for statement", add_special_tokens=False, return_tensors="pt")["input_ids"]
    with torch.inference_mode():
        out = hf.generate(ids, max_new_tokens=16, do_sample=False, pad_token_id=0)
    new = out[0, ids.shape[1] :].tolist()
    eos = tok.eos_token_id
    if eos in new:
        new = new[: new.index(eos)]
    pieces, _ = run(model, prompt="The for statement", max_tokens=16, temperature=0.0)
    assert "".join(pieces) == tok.decode(new, skip_special_tokens=True)


def test_chat_template_is_the_folders(model: TransformersModel) -> None:
    prompt = model.chat_template([{"role": "user", "content": "hi"}])
    assert prompt == "[user] hi\n[assistant] "
    assert model.count_tokens(prompt) > 2


def test_step_times_show_gil_wait(model: TransformersModel) -> None:
    """Decode steps record wall and thread-CPU time; a Python-busy thread beside the
    generation shows up as wait (wall - cpu). Reported, not asserted as a threshold."""
    before = model.statistics()
    stop = threading.Event()

    def busy() -> None:
        n = 0
        while not stop.is_set():
            n += 1

    t = threading.Thread(target=busy)
    t.start()
    try:
        run(model, prompt="The for statement", max_tokens=16, temperature=0.0)
    finally:
        stop.set()
        t.join()
    after = model.statistics()
    assert after.steps > before.steps
    assert after.wall_s >= after.cpu_s >= 0
    assert after.wait_s >= 0


@pytest.fixture(scope="module")
def served(folder: Path) -> Iterator[str]:
    proc = subprocess.Popen(
        serve_argv("--model", f"tiny=transformers:{folder}"),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        assert proc.stdout is not None
        url = None
        for line in proc.stdout:
            m = re.search(r"on (http://\S+)", line)
            if m:
                url = m.group(1)
                break
        assert url, "zeroserve serve did not start"
        yield url
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(START_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()  # an unclosed pipe is a ResourceWarning: an error here


def test_served_over_the_openai_api(served: str, model: TransformersModel) -> None:
    messages = [{"role": "user", "content": "hi"}]
    with openai.OpenAI(base_url=served + "/v1", api_key="unused", max_retries=0) as c:
        whole = c.chat.completions.create(
            model="tiny",
            messages=messages,
            max_tokens=12,
            temperature=0,  # type: ignore[arg-type]
        )
        chunks = list(
            c.chat.completions.create(
                model="tiny",
                messages=messages,
                max_tokens=12,
                temperature=0,
                stream=True,  # type: ignore[arg-type]
            )
        )
    streamed = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
    assert streamed == whole.choices[0].message.content
    direct, _ = run(model, prompt=model.chat_template(messages), max_tokens=12, temperature=0.0)
    assert streamed == "".join(direct)
    assert whole.usage is not None
    assert whole.usage.prompt_tokens == model.count_tokens("[user] hi\n[assistant] ")
