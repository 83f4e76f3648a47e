"""The shipped tinyllm demo model, run for real: golden output, KV cache against a
full-recompute reference, sampling, stop strings, max_tokens, UTF-8 safety, threads."""

from __future__ import annotations

import json
import threading
from collections.abc import Generator

import numpy as np
import pytest

pytest.importorskip("safetensors")
pytest.importorskip("tokenizers")

from zeroserve.models.base import GenerateRequest
from zeroserve.models.tinyllm import CONTEXT_LENGTH, MODEL_DIR, TextStream, TinyLlamaModel
from zeroserve.models.tinyllm._forward import KVCache, forward
from zeroserve.models.tinyllm._sample import Sampler

CHAT_PROMPT = "<|user|>\nstr.split\n<|assistant|>\n"
PLAIN_PROMPT = "The for statement is used to"

# Greedy output of the shipped weights for CHAT_PROMPT: its first 24 tokens and their
# text. `make model` on another CPython version changes the corpus and so these values;
# test_golden_greedy then prints the new ones.
GOLDEN_PROMPT_IDS = [2, 202, 502, 17, 86, 480, 294, 202, 3, 202]
GOLDEN_IDS_24 = [457, 262, 508, 315, 270, 773, 683, 663, 315, 270, 817, 376]
GOLDEN_IDS_24 += [202, 202, 479, 321, 86, 699, 17, 74, 17, 74, 17, 74]
GOLDEN_CHAT_24 = 'Return a list of the current line number of the same as\n\nThe "sys.g.g.g'


@pytest.fixture(scope="module")
def model() -> TinyLlamaModel:
    m = TinyLlamaModel()
    m.load()
    return m


def run(model: TinyLlamaModel, **kw: object) -> tuple[list[str], str]:
    """All pieces of one generation and its finish reason (the generator's value)."""
    gen: Generator[str, None, str] = model.generate(GenerateRequest(**kw))  # type: ignore[arg-type]
    pieces: list[str] = []
    while True:
        try:
            pieces.append(next(gen))
        except StopIteration as done:
            return pieces, done.value


def reference_ids(
    model: TinyLlamaModel,
    prompt: str,
    n: int,
    temperature: float = 0.0,
    top_p: float = 1.0,
    seed: int | None = None,
) -> list[int]:
    """Generated token ids recomputed from scratch each step (no cache reuse)."""
    w = model._loaded()
    ids = [model.eos_id, *model._encode(prompt)]
    req = GenerateRequest(temperature=temperature, top_p=top_p, seed=seed)
    sampler = Sampler(req, w.embed.shape[0], model._end_ids, ids)
    out: list[int] = []
    for _ in range(n):
        logits = forward(w, np.asarray(ids + out), KVCache(w, len(ids) + len(out)))
        tok = sampler.next(logits, len(out))
        if tok in model._end_ids:
            break
        out.append(tok)
    return out


def decode(model: TinyLlamaModel, ids: list[int]) -> str:
    """Bytes of ``ids`` as text, dropping an unfinished final character (as streams do)."""
    data = b"".join(model._token_bytes[i] for i in ids)
    return TextStream().push(data)


def test_shipped_artefacts() -> None:
    config = json.loads((MODEL_DIR / "config.json").read_text())
    assert config["max_position_embeddings"] == CONTEXT_LENGTH
    assert config["vocab_size"] == 1024
    assert 850_000 < config["parameters"] < 1_000_000
    assert (MODEL_DIR / "weights.safetensors").stat().st_size < 2_000_000
    assert (MODEL_DIR / "NOTICE.txt").is_file()
    assert TinyLlamaModel.capabilities() == frozenset({"generate"})
    assert "demo model" in TinyLlamaModel.description


def test_golden_greedy(model: TinyLlamaModel) -> None:
    pieces, _ = run(model, prompt=CHAT_PROMPT, max_tokens=24, temperature=0.0)
    text = "".join(pieces)
    ids = reference_ids(model, CHAT_PROMPT, 24)
    assert (model._encode(CHAT_PROMPT), ids, text) == (
        GOLDEN_PROMPT_IDS,
        GOLDEN_IDS_24,
        GOLDEN_CHAT_24,
    ), f"new golden values: {model._encode(CHAT_PROMPT)}, {ids}, {text!r}"
    assert run(model, prompt=CHAT_PROMPT, max_tokens=24, temperature=0.0)[0] == pieces


@pytest.mark.slow
def test_kv_cache_matches_full_recompute(model: TinyLlamaModel) -> None:
    for prompt in (CHAT_PROMPT, PLAIN_PROMPT, ""):
        pieces, reason = run(model, prompt=prompt, max_tokens=40, temperature=0.0)
        ids = reference_ids(model, prompt, 40)
        assert "".join(pieces) == decode(model, ids)
        assert reason == ("length" if len(ids) == 40 else "stop")


def test_end_of_text_finishes_with_stop(model: TinyLlamaModel) -> None:
    prompt = model.chat_template([{"role": "user", "content": "os.getcwd"}])
    # With this seed the model ends its answer (samples <|endoftext|>) after 18 tokens.
    pieces, reason = run(model, prompt=prompt, max_tokens=120, temperature=0.8, seed=1)
    assert reason == "stop"
    ids = reference_ids(model, prompt, 120, 0.8, 1.0, seed=1)
    assert len(ids) < 120
    assert "".join(pieces) == decode(model, ids) == "Some care because of the rawing locii."
    # An empty prompt: after <|endoftext|> the model opens a new turn (<|user|>), a
    # special token, so the answer is empty and finished.
    assert run(model, prompt="", max_tokens=10, temperature=0.0) == ([], "stop")


def test_sampling_is_deterministic_per_seed(model: TinyLlamaModel) -> None:
    kw = dict(prompt=PLAIN_PROMPT, max_tokens=30, temperature=0.9, top_p=0.95)
    a, _ = run(model, seed=7, **kw)
    b, _ = run(model, seed=7, **kw)
    c, _ = run(model, seed=8, **kw)
    assert a == b
    assert "".join(a) != "".join(c)
    ids = reference_ids(model, PLAIN_PROMPT, 30, 0.9, 0.95, seed=7)
    assert "".join(a) == decode(model, ids)


def test_tiny_top_p_is_greedy(model: TinyLlamaModel) -> None:
    greedy, _ = run(model, prompt=PLAIN_PROMPT, max_tokens=20, temperature=0.0)
    nucleus, _ = run(model, prompt=PLAIN_PROMPT, max_tokens=20, temperature=1.0, top_p=1e-9, seed=3)
    assert nucleus == greedy


def test_max_tokens_and_length_finish(model: TinyLlamaModel) -> None:
    assert run(model, prompt=PLAIN_PROMPT, max_tokens=0) == ([], "length")
    pieces, reason = run(model, prompt=PLAIN_PROMPT, max_tokens=5, temperature=0.0)
    assert reason == "length"
    assert "".join(pieces) == decode(model, reference_ids(model, PLAIN_PROMPT, 5))
    assert len(pieces) <= 5


def test_unbounded_generation_stops_within_context(model: TinyLlamaModel) -> None:
    pieces, reason = run(model, prompt=PLAIN_PROMPT, temperature=1.0, seed=1)
    assert reason in ("stop", "length")
    assert model.count_tokens("".join(pieces)) <= CONTEXT_LENGTH + 16


def test_prompt_longer_than_context_is_truncated(model: TinyLlamaModel) -> None:
    prompt = "the list of arguments " * 400
    assert model.count_tokens(prompt) > CONTEXT_LENGTH
    _, reason = run(model, prompt=prompt, max_tokens=3, temperature=0.0)
    assert reason in ("stop", "length")


def test_stop_strings_across_pieces(model: TinyLlamaModel) -> None:
    pieces, _ = run(model, prompt=PLAIN_PROMPT, max_tokens=60, temperature=0.0)
    text = "".join(pieces)
    # A stop string that straddles a piece boundary somewhere in the middle.
    at = len(pieces[0]) + len(pieces[1]) + len(pieces[2])
    stop = text[at - 2 : at + 3]
    assert len(stop) == 5
    got, reason = run(model, prompt=PLAIN_PROMPT, max_tokens=60, temperature=0.0, stop=[stop])
    assert reason == "stop"
    assert "".join(got) == text[: text.index(stop)]
    assert stop not in "".join(got)
    # Of several stop strings the earliest match wins; unmatched ones change nothing.
    later = text[at + 10 : at + 14]
    got, reason = run(
        model, prompt=PLAIN_PROMPT, max_tokens=60, temperature=0.0, stop=["\x00never", later, stop]
    )
    assert "".join(got) == text[: min(text.index(stop), text.index(later))]
    got, reason = run(
        model, prompt=PLAIN_PROMPT, max_tokens=60, temperature=0.0, stop=["\x00never"]
    )
    assert ("".join(got), reason) == (text, "length")


def test_text_stream_stop_and_partial_match() -> None:
    s = TextStream(["END", "xyz"])
    out = [s.push(b) for b in (b"abcE", b"N", b"D", b"more")]
    assert out == ["abc", "", "", ""]
    assert s.stopped
    assert s.flush() == ""
    s = TextStream(["END", "xyz"])
    out = [s.push(b) for b in (b"aEx", b"y", b"zEND")]
    assert out == ["aE", "", ""]
    s = TextStream(["END"])
    out = [s.push(b) for b in (b"abcE", b"NX")]
    assert "".join(out) + s.flush() == "abcENX"
    s = TextStream(["END"])
    assert s.push(b"xxEN") == "xx"
    assert s.flush() == "EN"


def test_utf8_split_across_tokens(model: TinyLlamaModel) -> None:
    text = "naïve café — 例えば “quotes” ✓ 🐍"
    ids = model._encode(text)
    chunks = [model._token_bytes[i] for i in ids]
    # The real tokenizer does split some character's bytes across tokens here.
    assert any(_incomplete_utf8(c) for c in chunks)
    stream = TextStream()
    pieces = [stream.push(c) for c in chunks]
    assert "".join(pieces) + stream.flush() == text
    assert all("\ufffd" not in p for p in pieces)
    # Byte at a time, too.
    stream = TextStream()
    assert "".join(stream.push(bytes([b])) for b in text.encode()) == text


@pytest.mark.slow
def test_generated_pieces_are_whole_characters(model: TinyLlamaModel) -> None:
    prompt = "naïve café — 例えば “quotes” ✓ 🐍 "
    for seed in range(3):
        pieces, _ = run(model, prompt=prompt, max_tokens=40, temperature=1.5, seed=seed)
        ids = reference_ids(model, prompt, 40, 1.5, 1.0, seed=seed)
        assert "".join(pieces) == decode(model, ids)


def test_concurrent_generations_equal_sequential(model: TinyLlamaModel) -> None:
    reqs = [
        dict(prompt=PLAIN_PROMPT, max_tokens=48, temperature=0.0),
        dict(prompt=CHAT_PROMPT, max_tokens=48, temperature=0.8, seed=11),
        dict(prompt="Return a new list", max_tokens=48, temperature=1.0, top_p=0.9, seed=5),
        dict(prompt="", max_tokens=48, temperature=0.7, seed=2),
    ] * 2
    expected = [run(model, **r) for r in reqs]
    results: list[tuple[list[str], str] | None] = [None] * len(reqs)
    barrier = threading.Barrier(len(reqs))

    def worker(i: int) -> None:
        barrier.wait()
        results[i] = run(model, **reqs[i])

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(len(reqs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results == expected


def test_chat_template_and_count_tokens(model: TinyLlamaModel) -> None:
    prompt = model.chat_template(
        [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "str.split"},
            {"role": "assistant", "content": "Split it."},
            {"role": "tool", "content": "x"},
        ]
    )
    assert prompt == (
        "<|system|>\nBe brief.\n<|user|>\nstr.split\n<|assistant|>\nSplit it.<|endoftext|>"
        "<|user|>\nx\n<|assistant|>\n"
    )
    assert model.count_tokens("<|user|>") == 1
    assert model.count_tokens("") == 0
    assert model.count_tokens(CHAT_PROMPT) == len(model._encode(CHAT_PROMPT))


def _incomplete_utf8(data: bytes) -> bool:
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        return True
    return False


# -- vLLM's sampling extensions (models/tinyllm/_sample.py) ---------------------------------


def _draws(req: GenerateRequest, logits: list[float], n: int = 200) -> set[int]:
    sampler = Sampler(req, len(logits), [], [])
    return {sampler.next(np.asarray(logits, dtype=np.float32), 5) for _ in range(n)}


def test_repetition_penalty_divides_positive_and_multiplies_negative_logits() -> None:
    # Token 0 was in the prompt: 3 / 2 = 1.5 falls below token 2's 2.
    s = Sampler(GenerateRequest(temperature=0, repetition_penalty=2.0), 3, [], [0])
    assert s.next(np.array([3.0, 1.0, 2.0], dtype=np.float32), 0) == 2
    # A negative logit is multiplied: -1 x 4 = -4 falls below -2.
    s = Sampler(GenerateRequest(temperature=0, repetition_penalty=4.0), 3, [], [0])
    assert s.next(np.array([-1.0, -3.0, -2.0], dtype=np.float32), 0) == 2
    # The answer's own tokens count too: the token just chosen is penalised next.
    s = Sampler(GenerateRequest(temperature=0, repetition_penalty=2.0), 3, [], [])
    logits = np.array([3.0, 1.0, 2.0], dtype=np.float32)
    assert [s.next(logits, 0), s.next(logits, 1)] == [0, 2]


def test_top_k_and_min_p_cut_what_is_drawn() -> None:
    logits = [4.0, 3.9, 3.8, 3.7, 0.0]
    free = _draws(GenerateRequest(temperature=1.0, seed=1), logits)
    assert len(free) >= 4
    assert _draws(GenerateRequest(temperature=1.0, seed=1, top_k=2), logits) == {0, 1}
    # exp(3.7 - 4) = 0.74 of the likeliest: min_p 0.8 drops tokens 3 and 4.
    assert _draws(GenerateRequest(temperature=1.0, seed=1, min_p=0.8), logits) == {0, 1, 2}
    assert _draws(GenerateRequest(temperature=1.0, seed=1, top_k=1), logits) == {0}


def test_end_tokens_are_held_back_by_ignore_eos_and_min_tokens() -> None:
    logits = np.array([9.0, 1.0, 2.0], dtype=np.float32)  # token 0 ends the answer
    assert Sampler(GenerateRequest(temperature=0), 3, [0], []).next(logits, 0) == 0
    ignore = Sampler(GenerateRequest(temperature=0, ignore_eos=True), 3, [0], [])
    assert [ignore.next(logits, k) for k in (0, 50)] == [2, 2]
    least = Sampler(GenerateRequest(temperature=0, min_tokens=3), 3, [0], [])
    assert [least.next(logits, k) for k in range(4)] == [2, 2, 2, 0]


def test_min_tokens_and_ignore_eos_run_the_answer_on(model: TinyLlamaModel) -> None:
    prompt = model.chat_template([{"role": "user", "content": "len"}])
    free, finish = run(model, prompt=prompt, max_tokens=48, temperature=1.0, seed=7)
    assert finish == "stop" and model.count_tokens("".join(free)) < 40
    kw: dict[str, object] = {"prompt": prompt, "max_tokens": 48, "temperature": 1.0, "seed": 7}
    longer, finish = run(model, min_tokens=40, **kw)
    assert model.count_tokens("".join(longer)) >= 40
    _, finish = run(model, ignore_eos=True, **kw)
    assert finish == "length"
