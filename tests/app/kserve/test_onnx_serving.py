"""ONNX models served with ``--model NAME=onnx:/path``: metadata from the graph, and
results from tritonclient (binary and JSON) compared with numpy, also under concurrent
load where requests are batched along the batch dimension."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from tests.support import ServerProcess
from tests.support.models import onnx_graphs as om

httpclient = pytest.importorskip("tritonclient.http")
pytest.importorskip("onnxruntime")

RTOL, ATOL = 1e-5, 1e-6


def client_for(server: ServerProcess, concurrency: int = 1):  # type: ignore[no-untyped-def]
    return httpclient.InferenceServerClient(f"{server.host}:{server.port}", concurrency=concurrency)


def x_input(x: np.ndarray, binary: bool = True):  # type: ignore[no-untyped-def]
    inp = httpclient.InferInput("X", list(x.shape), "FP32")
    inp.set_data_from_numpy(x, binary_data=binary)
    return inp


def test_metadata(kserve_server: ServerProcess) -> None:
    c = client_for(kserve_server)
    try:
        assert c.is_model_ready("mm") and c.is_model_ready("cls")
        meta = c.get_model_metadata("cls")
        assert meta["platform"] == "onnxruntime_onnx"
        assert meta["inputs"] == [{"name": "X", "datatype": "FP32", "shape": [-1, 4]}]
        assert meta["outputs"] == [
            {"name": "probs", "datatype": "FP32", "shape": [-1, 3]},
            {"name": "label", "datatype": "INT64", "shape": [-1]},
        ]
        assert c.get_model_metadata("mm")["outputs"] == [
            {"name": "Y", "datatype": "FP32", "shape": [-1, 3]}
        ]
    finally:
        c.close()


@pytest.mark.parametrize("binary", [True, False], ids=["binary", "json"])
def test_matmul_bias_and_classifier(kserve_server: ServerProcess, binary: bool) -> None:
    x = np.random.default_rng(7).standard_normal((6, 4)).astype(np.float32)
    c = client_for(kserve_server)
    try:
        out = [httpclient.InferRequestedOutput("Y", binary_data=binary)]
        y = c.infer("mm", [x_input(x, binary)], outputs=out).as_numpy("Y")
        np.testing.assert_allclose(y, om.ref_matmul_bias(x), rtol=RTOL, atol=ATOL)
        result = c.infer("cls", [x_input(x, binary)])
        probs, label = om.ref_softmax(x)
        np.testing.assert_allclose(result.as_numpy("probs"), probs, rtol=RTOL, atol=ATOL)
        np.testing.assert_array_equal(result.as_numpy("label"), label)
        # Only the label, as JSON.
        only = [httpclient.InferRequestedOutput("label", binary_data=False)]
        result = c.infer("cls", [x_input(x, binary)], outputs=only)
        assert [o["name"] for o in result.get_response()["outputs"]] == ["label"]
        np.testing.assert_array_equal(result.as_numpy("label"), label)
    finally:
        c.close()


def test_concurrent_requests_are_correct(kserve_server: ServerProcess) -> None:
    rng = np.random.default_rng(11)
    xs = [rng.standard_normal((int(rng.integers(1, 5)), 4)).astype(np.float32) for _ in range(48)]

    def one(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        c = client_for(kserve_server)
        try:
            r = c.infer("cls", [x_input(x)])
            return r.as_numpy("probs"), r.as_numpy("label")
        finally:
            c.close()

    with ThreadPoolExecutor(8) as pool:
        results = list(pool.map(one, xs))
    for x, (probs, label) in zip(xs, results, strict=True):
        ref_probs, ref_label = om.ref_softmax(x)
        np.testing.assert_allclose(probs, ref_probs, rtol=RTOL, atol=ATOL)
        np.testing.assert_array_equal(label, ref_label)


def test_model_errors_are_400(kserve_server: ServerProcess) -> None:
    from tritonclient.utils import InferenceServerException

    c = client_for(kserve_server)
    try:
        bad = httpclient.InferInput("X", [2, 5], "FP32")
        bad.set_data_from_numpy(np.ones((2, 5), np.float32))
        with pytest.raises(InferenceServerException, match="dimension 1 must be 4") as exc:
            c.infer("mm", [bad])
        assert exc.value.status() == "400"
        wrong = httpclient.InferInput("X", [1, 4], "FP64")
        wrong.set_data_from_numpy(np.ones((1, 4), np.float64))
        with pytest.raises(InferenceServerException, match="must be FP32"):
            c.infer("mm", [wrong])
        assert c.is_server_ready()
    finally:
        c.close()
