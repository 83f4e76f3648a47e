"""The onnxruntime backend: ``--model NAME=onnx:/path/model.onnx[?option=value&...]``.

Strategy
--------
One ``onnxruntime.InferenceSession`` per worker, on the ``thread`` executor by default:
``session.run`` releases the GIL, so the event loop keeps serving while the model runs.
The session uses ``intra_op_threads`` threads (default 1: several workers or replicas
scale better than one session fighting the server for every core).

V2 metadata (``inputs()`` / ``outputs()``) comes from the graph: ONNX element types as V2
datatypes, symbolic or unknown dimensions as ``-1``.

Dynamic batching: when every graph input and output has a variable first dimension, a
batch of requests whose other dimensions agree is concatenated along that dimension, run
once, and the outputs are split back by each request's share. Otherwise (fixed batch
dimension, mismatched shapes, or a model whose outputs do not keep the batch dimension)
each request is run on its own. ``max_batch_size`` (default 8) bounds how many requests
are combined; ``max_batch_size=1`` turns batching off.

Inputs must match the graph: every input given, no unknown ones, the graph's element type
and rank, and its fixed dimensions; anything else is a 400 naming the input. BYTES
inputs feed ``tensor(string)`` inputs (decoded as UTF-8). The KServe layer's
``"__parameters__"`` input, if present, is ignored.

Options: ``location`` (the ``.onnx`` file, set by the spec), ``intra_op_threads``,
``inter_op_threads``, ``providers`` (comma-separated onnxruntime execution providers,
default CPU) and ``graph_optimization`` (``disable|basic|extended|all``, default all).
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

import numpy as np

from ..errors import OnnxModelError, RequestError
from .base import ExecutorKind, Inputs, Model, Outputs, TensorSpec

# ONNX element types (as onnxruntime names them) -> V2 datatype and numpy dtype.
_TYPES: dict[str, tuple[str, Any]] = {
    "tensor(bool)": ("BOOL", np.bool_),
    "tensor(uint8)": ("UINT8", np.uint8),
    "tensor(uint16)": ("UINT16", np.uint16),
    "tensor(uint32)": ("UINT32", np.uint32),
    "tensor(uint64)": ("UINT64", np.uint64),
    "tensor(int8)": ("INT8", np.int8),
    "tensor(int16)": ("INT16", np.int16),
    "tensor(int32)": ("INT32", np.int32),
    "tensor(int64)": ("INT64", np.int64),
    "tensor(float16)": ("FP16", np.float16),
    "tensor(float)": ("FP32", np.float32),
    "tensor(double)": ("FP64", np.float64),
    "tensor(string)": ("BYTES", object),
}
# The KServe layer passes request parameters under this input name (app/endpoints/kserve).
PARAMETERS_INPUT = "__parameters__"
# One intra-op thread per session: the server runs many requests at once, and onnxruntime's
# default (one thread per core) would oversubscribe the machine under load.
DEFAULT_INTRA_OP_THREADS = 1
DEFAULT_MAX_BATCH_SIZE = 8
_OPTIMIZATION = ("disable", "basic", "extended", "all")


class _Tensor:
    __slots__ = ("datatype", "dtype", "name", "shape")

    def __init__(self, name: str, onnx_type: str, shape: Sequence[Any]) -> None:
        if onnx_type not in _TYPES:
            raise OnnxModelError(
                f"ONNX tensor {name!r} has type {onnx_type}, which V2 cannot carry"
            )
        self.name = name
        self.datatype, dtype = _TYPES[onnx_type]
        self.dtype = np.dtype(dtype)
        self.shape = tuple(d if isinstance(d, int) and d >= 0 else -1 for d in shape)

    @property
    def batch_dynamic(self) -> bool:
        return len(self.shape) > 0 and self.shape[0] == -1

    def spec(self) -> TensorSpec:
        return TensorSpec(self.name, self.datatype, self.shape)


class OnnxModel(Model):
    """An ONNX graph served by onnxruntime."""

    executor: ClassVar[ExecutorKind] = "thread"
    max_batch_size: ClassVar[int] = DEFAULT_MAX_BATCH_SIZE
    max_batch_delay_ms: ClassVar[float] = 2.0
    description: ClassVar[str] = "ONNX model on onnxruntime."
    platform: ClassVar[str] = "onnxruntime_onnx"

    def __init__(
        self,
        location: str = "",
        *,
        intra_op_threads: int = DEFAULT_INTRA_OP_THREADS,
        inter_op_threads: int = 1,
        providers: str = "CPUExecutionProvider",
        graph_optimization: str = "all",
        **options: Any,
    ) -> None:
        super().__init__(location=location, **options)
        if not location:
            raise OnnxModelError("the onnx backend needs a model path: NAME=onnx:/path/model.onnx")
        if graph_optimization not in _OPTIMIZATION:
            raise OnnxModelError(
                f"graph_optimization must be one of {', '.join(_OPTIMIZATION)}, "
                f"not {graph_optimization!r}"
            )
        self.location = os.path.expanduser(str(location))
        self.intra_op_threads = int(intra_op_threads)
        self.inter_op_threads = int(inter_op_threads)
        self.providers = [p for p in str(providers).split(",") if p]
        self.graph_optimization = graph_optimization
        self.session: Any = None
        self._inputs: list[_Tensor] = []
        self._outputs: list[_Tensor] = []
        self._by_name: dict[str, _Tensor] = {}
        self._batchable = False

    # -- lifecycle ---------------------------------------------------------------------
    def load(self) -> None:
        if self.session is not None:
            return
        try:
            import onnxruntime as ort
        except ImportError as exc:  # pragma: no cover - depends on the install
            raise OnnxModelError(
                "the onnx backend needs onnxruntime: pip install 'zeroserve[onnx]'"
            ) from exc
        if not os.path.isfile(self.location):
            raise OnnxModelError(f"no ONNX model at {self.location!r}")
        so = ort.SessionOptions()
        so.intra_op_num_threads = self.intra_op_threads
        so.inter_op_num_threads = self.inter_op_threads
        so.graph_optimization_level = {
            "disable": ort.GraphOptimizationLevel.ORT_DISABLE_ALL,
            "basic": ort.GraphOptimizationLevel.ORT_ENABLE_BASIC,
            "extended": ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED,
            "all": ort.GraphOptimizationLevel.ORT_ENABLE_ALL,
        }[self.graph_optimization]
        session = ort.InferenceSession(self.location, sess_options=so, providers=self.providers)
        self._inputs = [_Tensor(i.name, i.type, i.shape) for i in session.get_inputs()]
        self._outputs = [_Tensor(o.name, o.type, o.shape) for o in session.get_outputs()]
        self._by_name = {t.name: t for t in self._inputs}
        self._batchable = all(t.batch_dynamic for t in (*self._inputs, *self._outputs))
        self.session = session

    # -- metadata ----------------------------------------------------------------------
    def inputs(self) -> list[TensorSpec]:
        self.load()  # a metadata-only instance (process executor) reads the graph once
        return [t.spec() for t in self._inputs]

    def outputs(self) -> list[TensorSpec]:
        self.load()
        return [t.spec() for t in self._outputs]

    # -- inference ---------------------------------------------------------------------
    def infer(self, batch: Sequence[Inputs]) -> Sequence[Outputs]:
        if self.session is None:
            self.load()
        feeds = [self._feed(inputs) for inputs in batch]
        if len(feeds) > 1 and self._batchable and _same_item_shapes(feeds):
            combined = self._run_combined(feeds)
            if combined is not None:
                return combined
        return [self._run(feed) for feed in feeds]

    def _feed(self, inputs: Mapping[str, Any]) -> dict[str, np.ndarray]:
        feed: dict[str, np.ndarray] = {}
        for name, value in inputs.items():
            if name == PARAMETERS_INPUT:
                continue
            spec = self._by_name.get(name)
            if spec is None:
                expected = ", ".join(repr(t.name) for t in self._inputs)
                raise RequestError(f"unknown input {name[:64]!r}; the model takes {expected}")
            feed[name] = _check(spec, np.asarray(value))
        missing = [t.name for t in self._inputs if t.name not in feed]
        if missing:
            raise RequestError(f"missing input(s): {', '.join(repr(m) for m in missing)}")
        return feed

    def _run(self, feed: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        names = [t.name for t in self._outputs]
        try:
            values = self.session.run(names, feed)
        except Exception as exc:
            # onnxruntime's messages describe shapes and types, never the tensor data.
            raise RequestError(f"onnxruntime rejected the request: {exc}") from None
        return dict(zip(names, values, strict=True))

    def _run_combined(self, feeds: list[dict[str, np.ndarray]]) -> list[Outputs] | None:
        sizes = [next(iter(f.values())).shape[0] for f in feeds]
        if any(f[name].shape[0] != n for f, n in zip(feeds, sizes, strict=True) for name in f):
            return None  # inputs of one request disagree on their batch size
        joined = {name: np.concatenate([f[name] for f in feeds]) for name in feeds[0]}
        out = self._run(joined)
        total = sum(sizes)
        if any(v.ndim == 0 or v.shape[0] != total for v in out.values()):
            return None  # the outputs do not keep the batch dimension: run one by one
        cuts = np.cumsum(sizes)[:-1]
        parts = {name: np.split(v, cuts) for name, v in out.items()}
        return [{name: parts[name][i] for name in out} for i in range(len(feeds))]


def _check(spec: _Tensor, arr: np.ndarray) -> np.ndarray:
    if spec.datatype == "BYTES":
        if arr.dtype != object:
            raise RequestError(f"input {spec.name!r} must be BYTES")
        return np.array([_text(spec.name, x) for x in arr.reshape(-1)], dtype=object).reshape(
            arr.shape
        )
    if arr.dtype != spec.dtype:
        got = "BYTES" if arr.dtype == object else str(arr.dtype)
        raise RequestError(f"input {spec.name!r} must be {spec.datatype}, not {got}")
    if arr.ndim != len(spec.shape):
        raise RequestError(
            f"input {spec.name!r} must have {len(spec.shape)} dimensions, not {arr.ndim}"
        )
    for axis, (want, got_dim) in enumerate(zip(spec.shape, arr.shape, strict=True)):
        if want != -1 and want != got_dim:
            raise RequestError(
                f"input {spec.name!r}: dimension {axis} must be {want}, not {got_dim}"
            )
    return arr


def _text(name: str, item: Any) -> str:
    if isinstance(item, str):
        return item
    try:
        return bytes(item).decode("utf-8")
    except (UnicodeDecodeError, TypeError):
        raise RequestError(f"input {name!r}: string tensors must hold UTF-8 text") from None


def _same_item_shapes(feeds: list[dict[str, np.ndarray]]) -> bool:
    first = feeds[0]
    return all(
        f[name].ndim > 0 and f[name].shape[1:] == first[name].shape[1:]
        for f in feeds[1:]
        for name in first
    )
