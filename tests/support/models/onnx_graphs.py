"""Small ONNX graphs built with the ``onnx`` helper API (no downloads), and their numpy
references. Shared by the KServe suite and tests/models (the ONNX backend)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

IN_FEATURES = 4
CLASSES = 3
_RNG = np.random.default_rng(1234)
W = _RNG.standard_normal((IN_FEATURES, CLASSES)).astype(np.float32)
B = _RNG.standard_normal(CLASSES).astype(np.float32)


def _save(graph, path: Path) -> Path:  # type: ignore[no-untyped-def]
    import onnx
    from onnx import helper

    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8  # readable by every onnxruntime >= 1.14
    onnx.checker.check_model(model)
    onnx.save(model, str(path))
    return path


def _weights():  # type: ignore[no-untyped-def]
    from onnx import numpy_helper

    return [numpy_helper.from_array(W, "W"), numpy_helper.from_array(B, "B")]


def matmul_bias(path: Path, batch: int | str = "N") -> Path:
    """``Y = X @ W + B``: X FP32 [batch, 4] -> Y FP32 [batch, 3]."""
    from onnx import TensorProto, helper

    graph = helper.make_graph(
        [
            helper.make_node("MatMul", ["X", "W"], ["XW"]),
            helper.make_node("Add", ["XW", "B"], ["Y"]),
        ],
        "matmul_bias",
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, [batch, IN_FEATURES])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [batch, CLASSES])],
        initializer=_weights(),
    )
    return _save(graph, path)


def softmax_classifier(path: Path) -> Path:
    """``probs = softmax(X @ W + B)``, ``label = argmax(probs)`` (INT64)."""
    from onnx import TensorProto, helper

    graph = helper.make_graph(
        [
            helper.make_node("MatMul", ["X", "W"], ["XW"]),
            helper.make_node("Add", ["XW", "B"], ["logits"]),
            helper.make_node("Softmax", ["logits"], ["probs"], axis=-1),
            helper.make_node("ArgMax", ["probs"], ["label"], axis=-1, keepdims=0),
        ],
        "softmax_classifier",
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, ["N", IN_FEATURES])],
        [
            helper.make_tensor_value_info("probs", TensorProto.FLOAT, ["N", CLASSES]),
            helper.make_tensor_value_info("label", TensorProto.INT64, ["N"]),
        ],
        initializer=_weights(),
    )
    return _save(graph, path)


def strings_identity(path: Path) -> Path:
    """``T = Identity(S)`` on a string tensor [N]."""
    from onnx import TensorProto, helper

    graph = helper.make_graph(
        [helper.make_node("Identity", ["S"], ["T"])],
        "strings_identity",
        [helper.make_tensor_value_info("S", TensorProto.STRING, ["N"])],
        [helper.make_tensor_value_info("T", TensorProto.STRING, ["N"])],
    )
    return _save(graph, path)


def reduce_sum(path: Path) -> Path:
    """``S = ReduceSum(X)`` over everything: its output does not keep the batch dimension."""
    from onnx import TensorProto, helper

    graph = helper.make_graph(
        [helper.make_node("ReduceSum", ["X"], ["S"], keepdims=0)],
        "reduce_sum",
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, ["N", 2])],
        [helper.make_tensor_value_info("S", TensorProto.FLOAT, [])],
    )
    return _save(graph, path)


def ref_matmul_bias(x: np.ndarray) -> np.ndarray:
    return x @ W + B


def ref_softmax(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    logits = x.astype(np.float64) @ W + B
    e = np.exp(logits - logits.max(axis=-1, keepdims=True))
    probs = e / e.sum(axis=-1, keepdims=True)
    return probs, probs.argmax(axis=-1)
