"""The onnxruntime backend as a model (no server): graph metadata, inference against
numpy, dynamic batching along the batch dimension, input validation, spec parsing."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

pytest.importorskip("onnxruntime")
pytest.importorskip("onnx")

from tests.support.models import onnx_graphs as om
from zeroserve.errors import OnnxModelError, RequestError
from zeroserve.models.base import TensorSpec
from zeroserve.models.loader import parse_spec
from zeroserve.models.onnx_backend import OnnxModel

pytestmark = pytest.mark.backend


@pytest.fixture(scope="module")
def graphs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("onnx")
    return {
        "mm": om.matmul_bias(d / "mm.onnx"),
        "mm_fixed": om.matmul_bias(d / "mm_fixed.onnx", batch=2),
        "cls": om.softmax_classifier(d / "cls.onnx"),
        "str": om.strings_identity(d / "str.onnx"),
        "sum": om.reduce_sum(d / "sum.onnx"),
    }


def loaded(path: Path, **options: Any) -> OnnxModel:
    model = OnnxModel(location=str(path), **options)
    model.load()
    return model


class CountingSession:
    """Wraps an InferenceSession to count ``run`` calls (how many batches ran)."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.runs: list[dict[str, tuple[int, ...]]] = []

    def run(self, names: Any, feed: dict[str, np.ndarray]) -> Any:
        self.runs.append({k: v.shape for k, v in feed.items()})
        return self.inner.run(names, feed)


def test_metadata_from_the_graph(graphs: dict[str, Path]) -> None:
    model = OnnxModel(location=str(graphs["cls"]))  # metadata without an explicit load()
    assert model.inputs() == [TensorSpec("X", "FP32", (-1, 4))]
    assert model.outputs() == [
        TensorSpec("probs", "FP32", (-1, 3)),
        TensorSpec("label", "INT64", (-1,)),
    ]
    assert OnnxModel.platform == "onnxruntime_onnx"
    assert OnnxModel.executor == "thread"
    fixed = loaded(graphs["mm_fixed"])
    assert fixed.inputs() == [TensorSpec("X", "FP32", (2, 4))]
    assert loaded(graphs["str"]).inputs() == [TensorSpec("S", "BYTES", (-1,))]


def test_infer_matches_numpy(graphs: dict[str, Path]) -> None:
    x = np.random.default_rng(0).standard_normal((5, 4)).astype(np.float32)
    [out] = loaded(graphs["mm"]).infer([{"X": x}])
    np.testing.assert_allclose(out["Y"], om.ref_matmul_bias(x), rtol=1e-5, atol=1e-6)
    [out] = loaded(graphs["cls"]).infer([{"X": x}])
    probs, label = om.ref_softmax(x)
    np.testing.assert_allclose(out["probs"], probs, rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(out["label"], label)
    assert out["label"].dtype == np.int64


def test_dynamic_batch_runs_once_and_splits(graphs: dict[str, Path]) -> None:
    model = loaded(graphs["cls"])
    spy = model.session = CountingSession(model.session)
    rng = np.random.default_rng(1)
    xs = [rng.standard_normal((n, 4)).astype(np.float32) for n in (1, 3, 2)]
    outs = model.infer([{"X": x} for x in xs])
    assert spy.runs == [{"X": (6, 4)}]
    for x, out in zip(xs, outs, strict=True):
        probs, label = om.ref_softmax(x)
        assert out["probs"].shape == (len(x), 3)
        np.testing.assert_allclose(out["probs"], probs, rtol=1e-5, atol=1e-6)
        np.testing.assert_array_equal(out["label"], label)


def test_no_batching_where_the_graph_does_not_allow_it(graphs: dict[str, Path]) -> None:
    x = np.ones((2, 4), dtype=np.float32)
    fixed = loaded(graphs["mm_fixed"])
    spy = fixed.session = CountingSession(fixed.session)
    outs = fixed.infer([{"X": x}, {"X": x * 2}])
    assert len(spy.runs) == 2
    np.testing.assert_allclose(outs[1]["Y"], om.ref_matmul_bias(x * 2), rtol=1e-5, atol=1e-6)
    # The output drops the batch dimension: combining would be wrong, so each runs alone.
    summed = loaded(graphs["sum"])
    outs = summed.infer([{"X": np.ones((1, 2), np.float32)}, {"X": np.ones((3, 2), np.float32)}])
    assert [float(o["S"]) for o in outs] == [2.0, 6.0]


def test_inputs_are_validated(graphs: dict[str, Path]) -> None:
    model = loaded(graphs["mm"])
    with pytest.raises(RequestError, match="must be FP32"):
        model.infer([{"X": np.ones((1, 4), dtype=np.float64)}])
    with pytest.raises(RequestError, match="dimension 1 must be 4"):
        model.infer([{"X": np.ones((1, 5), dtype=np.float32)}])
    with pytest.raises(RequestError, match="2 dimensions"):
        model.infer([{"X": np.ones(4, dtype=np.float32)}])
    with pytest.raises(RequestError, match="missing input"):
        model.infer([{}])
    with pytest.raises(RequestError, match="unknown input"):
        model.infer([{"X": np.ones((1, 4), np.float32), "Z": np.ones(1)}])
    # The KServe layer's parameters input is not a graph input: ignored.
    params = np.array([b'{"a": 1}'], dtype=object)
    [out] = model.infer([{"X": np.ones((1, 4), np.float32), "__parameters__": params}])
    assert out["Y"].shape == (1, 3)


def test_string_tensors(graphs: dict[str, Path]) -> None:
    model = loaded(graphs["str"])
    s = np.array([b"caf\xc3\xa9", b"", b"x y"], dtype=object)
    [out] = model.infer([{"S": s}])
    assert list(out["T"]) == ["café", "", "x y"]
    with pytest.raises(RequestError, match="UTF-8"):
        model.infer([{"S": np.array([b"\xff"], dtype=object)}])


def test_spec_and_errors(graphs: dict[str, Path], tmp_path: Path) -> None:
    spec = parse_spec(f"clf=onnx:{graphs['cls']}?intra_op_threads=2&max_batch_size=4")
    assert spec.name == "clf" and spec.runtime == {"max_batch_size": 4}
    model = spec.factory()()
    assert isinstance(model, OnnxModel) and model.intra_op_threads == 2
    with pytest.raises(OnnxModelError, match="no ONNX model"):
        OnnxModel(location=str(tmp_path / "missing.onnx")).load()
    with pytest.raises(OnnxModelError, match="graph_optimization"):
        OnnxModel(location="x.onnx", graph_optimization="fast")
