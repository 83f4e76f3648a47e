"""The official ``tritonclient.http`` client, unmodified, against zeroserve: health,
metadata, and inference in binary and JSON (both ways and mixed) for every V2 datatype,
compared exactly with numpy."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest

from tests.support import ServerProcess

httpclient = pytest.importorskip("tritonclient.http")
from tritonclient.utils import InferenceServerException  # noqa: E402

NUMERIC = {
    "BOOL": np.bool_,
    "UINT8": np.uint8,
    "UINT16": np.uint16,
    "UINT32": np.uint32,
    "UINT64": np.uint64,
    "INT8": np.int8,
    "INT16": np.int16,
    "INT32": np.int32,
    "INT64": np.int64,
    "FP16": np.float16,
    "FP32": np.float32,
    "FP64": np.float64,
}
# (input sent as binary, output asked as binary)
MODES = [(True, True), (True, False), (False, True), (False, False)]
MODE_IDS = ["bin-bin", "bin-json", "json-bin", "json-json"]


@pytest.fixture
def client(kserve_server: ServerProcess) -> Iterator[object]:
    c = httpclient.InferenceServerClient(f"{kserve_server.host}:{kserve_server.port}")
    yield c
    c.close()


def sample(datatype: str, shape: tuple[int, ...], seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    dtype = np.dtype(NUMERIC[datatype])
    if dtype.kind == "b":
        return rng.integers(0, 2, shape).astype(bool)
    if dtype.kind == "f":
        arr = rng.standard_normal(shape).astype(dtype)
        if arr.size >= 3:  # the extremes of the type survive the round trip too
            arr.flat[0], arr.flat[1] = np.finfo(dtype).max, np.finfo(dtype).tiny
        return arr
    info = np.iinfo(dtype)
    arr = rng.integers(info.min, info.max, shape, dtype=dtype, endpoint=True)
    if arr.size >= 2:
        arr.flat[0], arr.flat[1] = info.min, info.max
    return arr


def infer_echo(client, name: str, arr: np.ndarray, datatype: str, mode: tuple[bool, bool], **kw):  # type: ignore[no-untyped-def]
    inp = httpclient.InferInput(name, list(arr.shape), datatype)
    inp.set_data_from_numpy(arr, binary_data=mode[0])
    out = httpclient.InferRequestedOutput(name, binary_data=mode[1])
    return client.infer("echo", [inp], outputs=[out], **kw)


def test_health_and_metadata(client) -> None:  # type: ignore[no-untyped-def]
    assert client.is_server_live()
    assert client.is_server_ready()
    assert client.is_model_ready("echo")
    assert client.is_model_ready("echo", "1")
    assert not client.is_model_ready("echo", "2")
    assert not client.is_model_ready("nope")
    meta = client.get_server_metadata()
    assert meta["name"] == "zeroserve" and "binary_tensor_data" in meta["extensions"]
    model = client.get_model_metadata("echo")
    assert model["name"] == "echo" and model["versions"] == ["1"] and model["platform"]
    assert model["inputs"] == [{"name": "INPUT0", "datatype": "BYTES", "shape": [-1]}]
    assert model["outputs"] == [{"name": "INPUT0", "datatype": "BYTES", "shape": [-1]}]
    assert client.get_model_metadata("echo", "1") == model
    for args in (("nope",), ("echo", "7")):
        with pytest.raises(InferenceServerException) as exc:
            client.get_model_metadata(*args)
        assert exc.value.status() == "404"


@pytest.mark.parametrize("mode", MODES, ids=MODE_IDS)
@pytest.mark.parametrize("datatype", list(NUMERIC))
def test_every_numeric_datatype(client, datatype: str, mode: tuple[bool, bool]) -> None:  # type: ignore[no-untyped-def]
    for i, shape in enumerate([(2, 3, 4), (7,), (0, 3), ()]):
        arr = sample(datatype, shape, seed=i)
        if datatype == "FP16" and not mode[0] and not np.isfinite(arr.astype(np.float64)).all():
            continue
        result = infer_echo(client, "INPUT0", arr, datatype, mode, request_id=f"r{i}")
        got = result.as_numpy("INPUT0")
        assert got.dtype == arr.dtype and got.shape == arr.shape
        np.testing.assert_array_equal(got, arr)
        response = result.get_response()
        assert response["id"] == f"r{i}" and response["model_name"] == "echo"
        assert response["outputs"][0]["datatype"] == datatype


ODD_BYTES = [b"", b"\x00", b"\xff\xfe\x00\x01", b"plain", bytes(range(256)), b"\x00" * 70000]


@pytest.mark.parametrize("out_binary", [True, False], ids=["out-bin", "out-json"])
def test_bytes_arbitrary_in_binary(client, out_binary: bool) -> None:  # type: ignore[no-untyped-def]
    arr = np.array(ODD_BYTES, dtype=object)
    if not out_binary:
        with pytest.raises(InferenceServerException, match="not UTF-8") as exc:
            infer_echo(client, "S", arr, "BYTES", (True, False))
        assert exc.value.status() == "400"
        arr = np.array([b"", b"text", "caf\u00e9 \u2603".encode(), b"\x00nul"], dtype=object)
    got = infer_echo(client, "S", arr, "BYTES", (True, out_binary)).as_numpy("S")
    assert got.shape == arr.shape
    expected = list(arr) if out_binary else [b.decode() for b in arr]
    assert list(got) == expected


@pytest.mark.parametrize("out_binary", [True, False], ids=["out-bin", "out-json"])
def test_bytes_json_in(client, out_binary: bool) -> None:  # type: ignore[no-untyped-def]
    arr = np.array([["a", "caf\u00e9"], ["", "\u2603 x"]], dtype=object)
    got = infer_echo(client, "S", arr, "BYTES", (False, out_binary)).as_numpy("S")
    assert got.shape == (2, 2)
    flat = [x.decode() if isinstance(x, bytes) else x for x in got.reshape(-1)]
    assert flat == ["a", "caf\u00e9", "", "\u2603 x"]


def test_mixed_inputs_outputs_selection_and_defaults(client) -> None:  # type: ignore[no-untyped-def]
    a = sample("FP32", (4, 5), seed=9)
    b = sample("INT16", (3,), seed=10)
    c = np.array([b"\x00\xff", b"z"], dtype=object)
    inputs = []
    for name, arr, dt, binary in (
        ("A", a, "FP32", True),
        ("B", b, "INT16", False),
        ("C", c, "BYTES", True),
    ):
        inp = httpclient.InferInput(name, list(arr.shape), dt)
        inp.set_data_from_numpy(arr, binary_data=binary)
        inputs.append(inp)
    # Only two outputs, one JSON and one binary, in the requested order.
    outs = [
        httpclient.InferRequestedOutput("B", binary_data=False),
        httpclient.InferRequestedOutput("A"),
    ]
    result = client.infer("echo", inputs, outputs=outs)
    names = [o["name"] for o in result.get_response()["outputs"]]
    assert names == ["B", "A"]
    np.testing.assert_array_equal(result.as_numpy("A"), a)
    np.testing.assert_array_equal(result.as_numpy("B"), b)
    assert result.as_numpy("C") is None
    # No outputs named: every output, in binary (the client sets binary_data_output).
    result = client.infer("echo", inputs)
    assert [o["name"] for o in result.get_response()["outputs"]] == ["A", "B", "C"]
    assert all("binary_data_size" in o["parameters"] for o in result.get_response()["outputs"])
    assert list(result.as_numpy("C")) == list(c)
    # Explicit version path.
    result = client.infer("echo", inputs, model_version="1")
    np.testing.assert_array_equal(result.as_numpy("B"), b)
    with pytest.raises(InferenceServerException) as exc:
        client.infer("echo", inputs, model_version="3")
    assert exc.value.status() == "404"


def test_parameters_reach_the_model(client) -> None:  # type: ignore[no-untyped-def]
    import json

    x = sample("INT32", (2,))
    inp = httpclient.InferInput("X", [2], "INT32")
    inp.set_data_from_numpy(x)
    result = client.infer("probe", [inp], parameters={"temperature": 0.5, "tag": "t", "flag": True})
    seen = result.as_numpy("params_seen")
    assert json.loads(seen[0]) == {"temperature": 0.5, "tag": "t", "flag": True}
    np.testing.assert_array_equal(result.as_numpy("X"), x)
    # Without parameters (and with only binary_data_output) the model gets none.
    result = client.infer("probe", [inp], outputs=[httpclient.InferRequestedOutput("X")])
    assert result.as_numpy("params_seen") is None


@pytest.mark.parametrize("algorithm", ["gzip", "deflate"])
def test_compressed_requests(client, algorithm: str) -> None:  # type: ignore[no-untyped-def]
    x = sample("FP64", (64, 8), seed=3)
    inp = httpclient.InferInput("X", list(x.shape), "FP64")
    inp.set_data_from_numpy(x)
    result = client.infer("echo", [inp], request_compression_algorithm=algorithm)
    np.testing.assert_array_equal(result.as_numpy("X"), x)


def test_unknown_output_is_400(client) -> None:  # type: ignore[no-untyped-def]
    inp = httpclient.InferInput("X", [1], "FP32")
    inp.set_data_from_numpy(np.ones(1, np.float32))
    with pytest.raises(InferenceServerException, match="unexpected inference output") as exc:
        client.infer("echo", [inp], outputs=[httpclient.InferRequestedOutput("Y")])
    assert exc.value.status() == "400"
    with pytest.raises(InferenceServerException) as exc:
        client.infer("nope", [inp])
    assert exc.value.status() == "404"
    assert client.is_server_live()


def test_large_binary_tensor(client) -> None:  # type: ignore[no-untyped-def]
    x = np.random.default_rng(5).standard_normal((1024, 1024)).astype(np.float32)  # 4 MiB
    inp = httpclient.InferInput("X", list(x.shape), "FP32")
    inp.set_data_from_numpy(x)
    got = client.infer("echo", [inp]).as_numpy("X")
    np.testing.assert_array_equal(got, x)
