"""Tensors in and out of KServe V2 bodies: JSON and Triton's binary tensor data extension.

Strategy
--------
A request body is one arena lease (``req.body``). With ``Inference-Header-Content-Length``
its first bytes are the JSON header, decoded by msgspec straight from that slice of the
body, and each input with ``parameters.binary_data_size`` owns the next slice of the bytes
after it, in input order. Numeric inputs become ``numpy.frombuffer`` views of their slice:
no copy, and since the slice lives in the arena the runtime hands it to ``process``
workers as a descriptor (also no copy). Views may be unaligned (the header length is
arbitrary); numpy and onnxruntime read unaligned data correctly.

A response is a list of buffers written with one ``writelines``: the JSON header, then
each binary output's own memory (``memoryview`` of the model's array; for ``echo`` the
request body itself).

Copies that cannot be avoided are counted with ``metrics.count_copy``:

* ``kserve_bytes_in`` / ``kserve_bytes_out``: BYTES elements (the model API wants ``bytes``
  objects; small output elements are packed next to their length prefixes);
* ``kserve_json_in`` / ``kserve_json_out``: tensors converted from or to JSON numbers;
* ``kserve_contiguous``: an output that was not C-contiguous little-endian memory;
* ``kserve_inflate``: a request body sent with ``Content-Encoding: gzip|deflate``.

Invariants
----------
* Every size in the request is checked before memory is touched or allocated: a declared
  size or shape larger than the body is a 400, never an allocation. Shapes are bounded
  in rank, per dimension and in element count (``app/limits.py``), and tensor and output
  counts by ``ApiLimits``; nesting too deep for the decoder is a 400 too.
* Error messages name fields and sizes, never tensor data.
* BYTES tensors reach models as numpy object arrays of ``bytes`` in the request's shape.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import msgspec
import numpy as np

from ... import metrics
from ...errors import RequestError, WorkerError
from ...runtime.tensors import BYTES, BYTES_LENGTH, read_bytes_tensor
from ..limits import (
    MAX_TENSOR_DIM,
    MAX_TENSOR_ELEMENTS,
    MAX_TENSOR_RANK,
    ApiLimits,
    check_count,
    decoding,
)
from .schemas import (
    InferenceRequest,
    InferenceResponse,
    Parameters,
    RequestOutput,
    ResponseOutput,
    encoder,
    request_decoder,
)

Buffer = bytes | bytearray | memoryview

# V2 datatype -> numpy dtype of its binary form (little-endian, native item size).
DTYPES: dict[str, np.dtype[Any]] = {
    "BOOL": np.dtype(np.bool_),
    "UINT8": np.dtype("u1"),
    "UINT16": np.dtype("<u2"),
    "UINT32": np.dtype("<u4"),
    "UINT64": np.dtype("<u8"),
    "INT8": np.dtype("i1"),
    "INT16": np.dtype("<i2"),
    "INT32": np.dtype("<i4"),
    "INT64": np.dtype("<i8"),
    "FP16": np.dtype("<f2"),
    "FP32": np.dtype("<f4"),
    "FP64": np.dtype("<f8"),
}
DATATYPES = (*DTYPES, BYTES)
# numpy dtype (kind + size) -> V2 datatype, for outputs.
_V2_OF: dict[tuple[str, int], str] = {(dt.kind, dt.itemsize): name for name, dt in DTYPES.items()}
# The JSON element kinds numpy infers (bool, signed, unsigned, float) each datatype accepts.
_JSON_KINDS: dict[str, str] = {"b": "bi", "i": "biu", "u": "biu", "f": "biuf"}

# The input under which a request's ``parameters`` reach the model (see ``kserve``).
PARAMETERS_INPUT = "__parameters__"
# Request-level parameter of the binary extension (consumed here, not passed on).
BINARY_DATA_OUTPUT = "binary_data_output"

# BYTES output elements at least this large are written from their own memory; smaller
# ones are packed with their length prefixes into one buffer (a short copy is cheaper than
# an iovec entry per element).
SPLICE_MIN_BYTES = 16 * 1024
# Longest tensor name quoted in an error message.
_NAME_MAX = 64


@dataclass(slots=True)
class DecodedRequest:
    request: InferenceRequest
    inputs: dict[str, Any]


def _q(name: str) -> str:
    """A name as quoted in error messages (bounded, never the tensor data)."""
    return repr(name if len(name) <= _NAME_MAX else name[:_NAME_MAX] + "...")


# -- requests --------------------------------------------------------------------------


def header_length(value: bytes | None, body_size: int) -> int | None:
    """The ``Inference-Header-Content-Length`` header as a JSON header size, checked."""
    if value is None:
        return None
    text = value.strip()
    if not text.isdigit() or len(text) > 19:
        raise RequestError("Inference-Header-Content-Length must be a non-negative integer")
    n = int(text)
    if n > body_size:
        raise RequestError(
            f"Inference-Header-Content-Length ({n}) exceeds the request body ({body_size} bytes)"
        )
    return n


_DEFAULT_LIMITS = ApiLimits()


def decode_request(
    body: memoryview, json_size: int | None, limits: ApiLimits = _DEFAULT_LIMITS
) -> DecodedRequest:
    """Decode an inference request; numeric binary inputs are views of ``body``."""
    total = body.nbytes
    end = total if json_size is None else json_size
    try:
        with decoding("the inference request JSON"):
            request = request_decoder.decode(body[:end])
    except msgspec.ValidationError as exc:
        raise RequestError(f"invalid inference request: {exc}") from None
    except msgspec.DecodeError as exc:
        raise RequestError(f"malformed inference request JSON: {exc}") from None
    check_count(len(request.inputs), limits.v2_inputs, "inputs", "input tensors")
    if request.outputs is not None:
        check_count(len(request.outputs), limits.v2_outputs, "outputs", "requested outputs")
    offset = end
    inputs: dict[str, Any] = {}
    for inp in request.inputs:
        name = inp.name
        if name in inputs or name == PARAMETERS_INPUT:
            what = "reserved" if name == PARAMETERS_INPUT else "given twice"
            raise RequestError(f"input {_q(name)} is {what}")
        if inp.datatype not in DTYPES and inp.datatype != BYTES:
            raise RequestError(
                f"input {_q(name)} has unsupported datatype {_q(inp.datatype)}; "
                f"expected one of {', '.join(DATATYPES)}"
            )
        count = _element_count(name, inp.shape)
        params = inp.parameters or {}
        if "shared_memory_region" in params:
            raise RequestError(f"input {_q(name)}: the shared-memory extension is not supported")
        size = params.get("binary_data_size")
        if size is not None:
            if inp.data is not None:
                raise RequestError(f"input {_q(name)} has both 'data' and binary_data_size")
            if json_size is None:
                raise RequestError(
                    f"input {_q(name)} has binary_data_size but the request has no "
                    "Inference-Header-Content-Length header"
                )
            if isinstance(size, bool) or not isinstance(size, int) or size < 0:
                raise RequestError(f"input {_q(name)}: binary_data_size must be an integer >= 0")
            if size > total - offset:
                raise RequestError(
                    f"input {_q(name)}: binary_data_size ({size}) runs past the end of the "
                    f"body ({total - offset} bytes of binary data left)"
                )
            inputs[name] = _binary_tensor(body, offset, size, inp.datatype, inp.shape, count, name)
            offset += size
        else:
            if inp.data is None:
                raise RequestError(f"input {_q(name)} has neither 'data' nor binary_data_size")
            inputs[name] = _json_tensor(inp.data, inp.datatype, inp.shape, count, name)
    if offset != total:
        raise RequestError(
            f"the body has {total - offset} bytes after the JSON header that no input's "
            "binary_data_size accounts for"
        )
    return DecodedRequest(request, inputs)


def _element_count(name: str, shape: Sequence[int]) -> int:
    if len(shape) > MAX_TENSOR_RANK:
        raise RequestError(
            f"input {_q(name)} has {len(shape)} dimensions; at most {MAX_TENSOR_RANK} are accepted"
        )
    # Nonzero dimensions multiplied: an empty tensor must still have a buildable shape.
    nonzero = 1
    for dim in shape:
        if dim < 0:
            raise RequestError(f"input {_q(name)} has a negative dimension in its shape")
        if dim > MAX_TENSOR_DIM:
            raise RequestError(
                f"input {_q(name)} has a dimension above {MAX_TENSOR_DIM} in its shape"
            )
        if dim:
            nonzero *= dim
            if nonzero > MAX_TENSOR_ELEMENTS:
                raise RequestError(
                    f"input {_q(name)}: its shape has more than {MAX_TENSOR_ELEMENTS} elements"
                )
    return math.prod(shape)


def _shape_text(shape: Sequence[int]) -> str:
    return "[" + ", ".join(str(d) for d in shape) + "]"


def _binary_tensor(
    body: memoryview,
    offset: int,
    size: int,
    datatype: str,
    shape: list[int],
    count: int,
    name: str,
) -> np.ndarray:
    if datatype == BYTES:
        return _bytes_elements(body, offset, size, shape, count, name)
    dtype = DTYPES[datatype]
    need = count * dtype.itemsize
    if need != size:
        raise RequestError(
            f"input {_q(name)}: shape {_shape_text(shape)} of {datatype} needs {need} bytes "
            f"but binary_data_size is {size}"
        )
    if count == 0:
        return np.empty(shape, dtype=dtype)
    return np.frombuffer(body, dtype=dtype, count=count, offset=offset).reshape(shape)


def _bytes_elements(
    body: memoryview, offset: int, size: int, shape: list[int], count: int, name: str
) -> np.ndarray:
    what = f"input {_q(name)} (shape {_shape_text(shape)})"
    out = read_bytes_tensor(body[offset : offset + size], count, what)
    metrics.count_copy("kserve_bytes_in", size - BYTES_LENGTH.size * count)
    return out.reshape(shape)


def _json_tensor(data: Any, datatype: str, shape: list[int], count: int, name: str) -> np.ndarray:
    if not isinstance(data, list):
        raise RequestError(f"input {_q(name)}: 'data' must be an array")
    if datatype == BYTES:
        flat: list[bytes] = []
        if not _flatten_strings(data, flat, len(shape)):
            raise RequestError(f"input {_q(name)}: BYTES data must be strings")
        if len(flat) != count:
            raise RequestError(
                f"input {_q(name)}: shape {_shape_text(shape)} has {count} elements but "
                f"'data' has {len(flat)}"
            )
        out = np.empty(count, dtype=object)
        out[:] = flat
        metrics.count_copy("kserve_json_in", sum(len(b) for b in flat))
        return out.reshape(shape)
    dtype = DTYPES[datatype]
    try:
        raw = np.array(data)
    except (ValueError, TypeError, OverflowError):
        raise RequestError(f"input {_q(name)}: 'data' is not a regular array of numbers") from None
    if raw.size != count:
        raise RequestError(
            f"input {_q(name)}: shape {_shape_text(shape)} has {count} elements but 'data' "
            f"has {raw.size}"
        )
    if dtype.kind in "iu" and raw.dtype.kind in "fO":
        # Integers beyond int64 (UINT64's upper half) make numpy infer float64 or object:
        # convert from the Python ints themselves, exactly.
        return _json_big_ints(data, dtype, datatype, shape, name)
    if raw.size and raw.dtype.kind not in _JSON_KINDS[dtype.kind]:
        raise RequestError(f"input {_q(name)}: 'data' elements are not valid {datatype} values")
    if dtype.kind in "iu" and raw.size and raw.dtype.kind in "iu":
        info = np.iinfo(dtype)
        if raw.min() < info.min or raw.max() > info.max:
            raise RequestError(f"input {_q(name)}: 'data' has values out of range for {datatype}")
    if (
        dtype.kind == "b"
        and raw.size
        and raw.dtype.kind in "iu"
        and (raw.min() < 0 or raw.max() > 1)
    ):
        raise RequestError(f"input {_q(name)}: BOOL data must be true/false (or 0/1)")
    try:
        # A number the float type cannot hold would become inf (numpy only warns): refused.
        with np.errstate(over="raise", invalid="raise"):
            arr = raw.astype(dtype).reshape(shape)
    except FloatingPointError:
        raise RequestError(
            f"input {_q(name)}: 'data' has values out of range for {datatype}"
        ) from None
    metrics.count_copy("kserve_json_in", arr.nbytes)
    return arr


def _json_big_ints(
    data: list[Any], dtype: np.dtype[Any], datatype: str, shape: list[int], name: str
) -> np.ndarray:
    flat: list[Any] = []
    if not _flatten(data, flat, len(shape)):
        raise RequestError(f"input {_q(name)}: 'data' nests deeper than its shape")
    if not all(type(v) is int for v in flat):
        raise RequestError(f"input {_q(name)}: 'data' elements are not valid {datatype} values")
    info = np.iinfo(dtype)
    if flat and (min(flat) < info.min or max(flat) > info.max):
        raise RequestError(f"input {_q(name)}: 'data' has values out of range for {datatype}")
    arr = np.array(flat, dtype=dtype).reshape(shape)
    metrics.count_copy("kserve_json_in", arr.nbytes)
    return arr


def _flatten(data: list[Any], out: list[Any], depth: int) -> bool:
    """Flatten nested lists at most ``depth`` deep (a tensor's rank: its JSON may be
    nested per dimension, or flat); False if deeper."""
    for item in data:
        if isinstance(item, list):
            if depth <= 1 or not _flatten(item, out, depth - 1):
                return False
        else:
            out.append(item)
    return True


def _flatten_strings(data: list[Any], out: list[bytes], depth: int) -> bool:
    for item in data:
        if isinstance(item, str):
            out.append(item.encode("utf-8"))
        elif isinstance(item, list):
            if depth <= 1 or not _flatten_strings(item, out, depth - 1):
                return False
        else:
            return False
    return True


def model_parameters(request: InferenceRequest) -> np.ndarray | None:
    """The request's parameters for the model, as a one-element BYTES tensor holding their
    JSON (a form every executor carries), or None when there are none to pass."""
    params = request.parameters
    if not params:
        return None
    passed = {k: v for k, v in params.items() if k != BINARY_DATA_OUTPUT}
    if not passed:
        return None
    out = np.empty(1, dtype=object)
    out[0] = encoder.encode(passed)
    return out


# -- responses -------------------------------------------------------------------------


def _flag(params: Parameters | None, key: str, default: bool) -> bool:
    if not params or key not in params:
        return default
    value = params[key]
    if not isinstance(value, bool):
        raise RequestError(f"parameter {key!r} must be a boolean")
    return value


def _selected(request: InferenceRequest, outputs: Mapping[str, Any]) -> list[tuple[str, bool]]:
    binary_default = _flag(request.parameters, BINARY_DATA_OUTPUT, False)
    if not request.outputs:  # absent (or empty): every output, with default settings
        return [(k, binary_default) for k in outputs if k != PARAMETERS_INPUT]
    seen: set[str] = set()
    chosen: list[tuple[str, bool]] = []
    for out in request.outputs:
        _check_output_request(out)
        if out.name in seen:
            raise RequestError(f"output {_q(out.name)} is requested twice")
        seen.add(out.name)
        chosen.append((out.name, _flag(out.parameters, "binary_data", binary_default)))
    return chosen


def _check_output_request(out: RequestOutput) -> None:
    params = out.parameters
    if not params:
        return
    if "shared_memory_region" in params:
        raise RequestError(f"output {_q(out.name)}: the shared-memory extension is not supported")
    if params.get("classification"):
        raise RequestError(f"output {_q(out.name)}: the classification extension is not supported")


def encode_response(
    model_name: str,
    model_version: str | None,
    request: InferenceRequest,
    outputs: Mapping[str, Any],
) -> tuple[list[Buffer], int | None]:
    """The response body as buffers, and the JSON header's size when binary data follows
    it (the ``Inference-Header-Content-Length``), else None."""
    described: list[ResponseOutput] = []
    data: list[Buffer] = []
    any_binary = False
    for name, binary in _selected(request, outputs):
        if name not in outputs or name == PARAMETERS_INPUT:
            raise RequestError(f"unexpected inference output {_q(name)} for model {_q(model_name)}")
        arr = _as_array(name, outputs[name])
        datatype = _datatype(name, arr)
        shape = list(arr.shape)
        if binary:
            any_binary = True
            size = _binary_buffers(name, arr, datatype, data)
            described.append(
                ResponseOutput(
                    name=name,
                    datatype=datatype,
                    shape=shape,
                    parameters={"binary_data_size": size},
                )
            )
        else:
            described.append(
                ResponseOutput(
                    name=name, datatype=datatype, shape=shape, data=_json_data(name, arr, datatype)
                )
            )
    header = encoder.encode(
        InferenceResponse(
            model_name=model_name,
            model_version=model_version,
            id=request.id,
            outputs=described,
        )
    )
    if not any_binary:
        return [header], None
    return [header, *data], len(header)


def _as_array(name: str, value: Any) -> np.ndarray:
    if isinstance(value, np.ndarray):
        return value
    if isinstance(value, bytes | bytearray | memoryview):
        return np.frombuffer(value, dtype=np.uint8)
    raise WorkerError(
        f"output {_q(name)} is a {type(value).__name__}, not a numpy array or a buffer"
    )


def _datatype(name: str, arr: np.ndarray) -> str:
    kind = arr.dtype.kind
    if kind in "OSU":
        return BYTES
    dt = _V2_OF.get((kind, arr.dtype.itemsize))
    if dt is None:
        raise WorkerError(f"output {_q(name)} has dtype {arr.dtype}, which V2 cannot represent")
    return dt


def _element_bytes(name: str, item: Any) -> bytes | bytearray | memoryview:
    if isinstance(item, bytes | bytearray):
        return item
    if isinstance(item, str):
        return item.encode("utf-8")
    if isinstance(item, memoryview):
        return item.cast("B") if item.format != "B" else item
    raise WorkerError(f"BYTES output {_q(name)} holds a {type(item).__name__}, not bytes")


def _binary_buffers(name: str, arr: np.ndarray, datatype: str, out: list[Buffer]) -> int:
    if datatype == BYTES:
        return _bytes_buffers(name, arr, out)
    want = DTYPES[datatype]
    if arr.dtype != want or not arr.flags.c_contiguous:
        arr = np.ascontiguousarray(arr, dtype=want)
        metrics.count_copy("kserve_contiguous", arr.nbytes)
    if arr.nbytes:
        out.append(memoryview(arr.reshape(-1).view(np.uint8)))  # type: ignore[arg-type]
    return arr.nbytes


def _bytes_buffers(name: str, arr: np.ndarray, out: list[Buffer]) -> int:
    total = 0
    packed = bytearray()
    copied = 0
    for item in arr.reshape(-1):
        raw = _element_bytes(name, item)
        n = raw.nbytes if isinstance(raw, memoryview) else len(raw)
        packed += BYTES_LENGTH.pack(n)
        if n >= SPLICE_MIN_BYTES:
            out.append(packed)
            out.append(raw)
            packed = bytearray()
        else:
            packed += raw
            copied += n
        total += BYTES_LENGTH.size + n
    if packed:
        out.append(packed)
    if copied:
        metrics.count_copy("kserve_bytes_out", copied)
    return total


def _json_data(name: str, arr: np.ndarray, datatype: str) -> list[Any]:
    if datatype == BYTES:
        items: list[str] = []
        for item in arr.reshape(-1):
            raw = _element_bytes(name, item)
            try:
                items.append(str(raw, "utf-8") if not isinstance(raw, str) else raw)
            except UnicodeDecodeError:
                raise RequestError(
                    f"output {_q(name)} holds bytes that are not UTF-8 and cannot be JSON "
                    "strings; request it with binary_data"
                ) from None
        metrics.count_copy("kserve_json_out", sum(len(s) for s in items))
        return items
    metrics.count_copy("kserve_json_out", arr.nbytes)
    return arr.reshape(-1).tolist()  # type: ignore[no-any-return]
