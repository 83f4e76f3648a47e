"""Malformed and hostile V2 requests over raw HTTP: each gets its 4xx as
``{"error": "<message>"}``, no error body echoes the request's data, and the server stays
healthy afterwards."""

from __future__ import annotations

import json
import socket
import struct
from collections.abc import Iterator
from typing import Any

import httpx
import numpy as np
import pytest

from tests.support import ServerProcess, scaled

MARK = "SECRET-7f3a"  # put into request data; must never appear in an error body
IHCL = "Inference-Header-Content-Length"


@pytest.fixture
def http(kserve_server: ServerProcess) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=kserve_server.url, timeout=scaled(10)) as client:
        yield client
    # Whatever was sent, the server is still healthy and still serves inference.
    with httpx.Client(base_url=kserve_server.url, timeout=scaled(10)) as client:
        assert client.get("/v2/health/live").status_code == 200
        r = client.post("/v2/models/echo/infer", json=_json_req([1.5], "FP32", [1]))
        assert r.status_code == 200 and r.json()["outputs"][0]["data"] == [1.5]


def _json_req(data: Any, datatype: str, shape: list[int], **extra: Any) -> dict[str, Any]:
    return {"inputs": [{"name": "x", "datatype": datatype, "shape": shape, "data": data}], **extra}


def binary_body(header: dict[str, Any], *tensors: bytes) -> tuple[bytes, int]:
    head = json.dumps(header).encode()
    return head + b"".join(tensors), len(head)


def expect_error(r: httpx.Response, status: int, fragment: str = "") -> str:
    assert r.status_code == status, r.text
    assert r.headers["content-type"].startswith("application/json")
    body = r.json()
    assert list(body) == ["error"] and isinstance(body["error"], str)
    assert fragment.lower() in body["error"].lower(), body["error"]
    assert MARK not in r.text
    return str(body["error"])


def post_binary(
    http: httpx.Client, header: dict[str, Any], *tensors: bytes, ihcl: Any = None
) -> httpx.Response:
    body, n = binary_body(header, *tensors)
    return http.post(
        "/v2/models/echo/infer", content=body, headers={IHCL: str(n if ihcl is None else ihcl)}
    )


def fp32_input(name: str, shape: list[int], size: int) -> dict[str, Any]:
    return {
        "name": name,
        "datatype": "FP32",
        "shape": shape,
        "parameters": {"binary_data_size": size},
    }


def test_malformed_json(http: httpx.Client) -> None:
    for body in (b"", b"{", b'{"inputs": [' + MARK.encode(), b"\xff\xfe", b"[]", b'{"inputs": 5}'):
        expect_error(http.post("/v2/models/echo/infer", content=body), 400)
    r = http.post(
        "/v2/models/echo/infer", json={"inputs": [{"name": "x", "shape": [1], "data": [1]}]}
    )
    expect_error(r, 400, "datatype")
    # Binary: the header slice itself is malformed.
    r = http.post(
        "/v2/models/echo/infer", content=b'{"inputs": [}' + MARK.encode(), headers={IHCL: "13"}
    )
    expect_error(r, 400, "malformed")


def test_wrong_inference_header_content_length(http: httpx.Client) -> None:
    header = {"inputs": [fp32_input("x", [2], 8)]}
    data = np.ones(2, np.float32).tobytes()
    body, n = binary_body(header, data)
    for bad in ("abc", "-1", "1e3", str(len(body) + 1), "99999999999999999999999"):
        r = http.post("/v2/models/echo/infer", content=body, headers={IHCL: bad})
        expect_error(r, 400, "Inference-Header-Content-Length")
    # Too short: the JSON is cut off. Too long: JSON plus tensor bytes is not JSON.
    expect_error(post_binary(http, header, data, ihcl=n - 3), 400)
    expect_error(post_binary(http, header, data, ihcl=n + 4), 400)
    # Binary inputs without the header at all.
    expect_error(http.post("/v2/models/echo/infer", content=body), 400)
    expect_error(
        http.post("/v2/models/echo/infer", content=body[:n]), 400, "Inference-Header-Content-Length"
    )


def test_slices_out_of_range(http: httpx.Client) -> None:
    data = np.ones(4, np.float32).tobytes()
    # Declared slice larger than what follows the header.
    expect_error(
        post_binary(http, {"inputs": [fp32_input("x", [8], 32)]}, data), 400, "past the end"
    )
    # Two inputs whose slices together run past the end.
    header = {"inputs": [fp32_input("a", [2], 8), fp32_input("b", [4], 16)]}
    expect_error(post_binary(http, header, data), 400, "past the end")
    # Bytes left over that no input accounts for.
    expect_error(
        post_binary(http, {"inputs": [fp32_input("x", [2], 8)]}, data), 400, "accounts for"
    )
    # Sizes that are not sizes.
    for size in (-1, "8", 1.5, True, None):
        inp = fp32_input("x", [2], 8)
        inp["parameters"]["binary_data_size"] = size
        if size is None:
            inp["parameters"] = {}
        r = post_binary(http, {"inputs": [inp]}, data[:8])
        expect_error(r, 400)


def test_shape_and_size_mismatches(http: httpx.Client) -> None:
    data = np.ones(6, np.float32).tobytes()
    error = expect_error(post_binary(http, {"inputs": [fp32_input("x", [2, 2], 24)]}, data), 400)
    assert "[2, 2]" in error and "16" in error and "24" in error
    expect_error(
        post_binary(http, {"inputs": [fp32_input("x", [-2, -3], 24)]}, data), 400, "negative"
    )
    r = http.post("/v2/models/echo/infer", json=_json_req([1, 2, 3], "INT32", [2, 2]))
    expect_error(r, 400, "4 elements")
    r = http.post("/v2/models/echo/infer", json=_json_req([[1, 2], [3]], "INT32", [3]))
    expect_error(r, 400)
    r = http.post("/v2/models/echo/infer", json=_json_req([MARK, "x"], "FP32", [2]))
    expect_error(r, 400, "FP32")
    r = http.post("/v2/models/echo/infer", json=_json_req([300], "UINT8", [1]))
    expect_error(r, 400, "range")
    r = http.post("/v2/models/echo/infer", json=_json_req([2**64], "UINT64", [1]))
    expect_error(r, 400)
    r = http.post("/v2/models/echo/infer", json=_json_req([2], "BOOL", [1]))
    expect_error(r, 400, "BOOL")
    # Numbers the float type cannot hold (they would become inf): refused, as integers are
    # (found by the long fuzz campaign; under warnings-as-errors they were a 500).
    for data, datatype in (([1e300], "FP32"), ([70000], "FP16"), ([1.0, 1e39], "FP32")):
        r = http.post("/v2/models/echo/infer", json=_json_req(data, datatype, [len(data)]))
        expect_error(r, 400, "range")
    r = http.post("/v2/models/echo/infer", json=_json_req([1], "COMPLEX64", [1]))
    expect_error(r, 400, "datatype")
    r = http.post("/v2/models/echo/infer", json=_json_req([1, MARK], "BYTES", [2]))
    expect_error(r, 400, "strings")
    r = http.post(
        "/v2/models/echo/infer", json={"inputs": [{"name": "x", "datatype": "FP32", "shape": [1]}]}
    )
    expect_error(r, 400, "neither")
    twice = {"inputs": [_json_req([1], "INT8", [1])["inputs"][0]] * 2}
    expect_error(http.post("/v2/models/echo/infer", json=twice), 400, "twice")


def test_bytes_elements_checked(http: httpx.Client) -> None:
    def bytes_input(shape: list[int], size: int) -> dict[str, Any]:
        return {
            "name": "s",
            "datatype": "BYTES",
            "shape": shape,
            "parameters": {"binary_data_size": size},
        }

    good = struct.pack("<I", 3) + MARK.encode()[:3]
    r = post_binary(http, {"inputs": [bytes_input([1], len(good))]}, good)
    assert r.status_code == 200
    # A length prefix that runs past the tensor's slice.
    bad = struct.pack("<I", 1000) + MARK.encode()
    expect_error(post_binary(http, {"inputs": [bytes_input([1], len(bad))]}, bad), 400, "past")
    # A truncated length prefix, and elements left over.
    expect_error(
        post_binary(http, {"inputs": [bytes_input([2], len(good) + 2)]}, good + b"\x01\x00"),
        400,
        "truncated",
    )
    expect_error(
        post_binary(http, {"inputs": [bytes_input([1], len(good) * 2)]}, good * 2), 400, "follow"
    )


def test_huge_declared_sizes(http: httpx.Client) -> None:
    data = np.ones(2, np.float32).tobytes()
    expect_error(
        post_binary(http, {"inputs": [fp32_input("x", [2], 2**62)]}, data), 400, "past the end"
    )
    expect_error(
        post_binary(http, {"inputs": [fp32_input("x", [2**20, 2**20], 8)]}, data), 400, "needs"
    )
    # A shape past the element bound (app/limits.py) is refused before its size is compared.
    expect_error(
        post_binary(http, {"inputs": [fp32_input("x", [2**31, 2**31], 8)]}, data), 400, "elements"
    )
    # A BYTES tensor claiming 2^40 elements in 8 bytes is refused before any allocation.
    big = {
        "inputs": [
            {
                "name": "s",
                "datatype": "BYTES",
                "shape": [2**40],
                "parameters": {"binary_data_size": 8},
            }
        ]
    }
    expect_error(post_binary(http, big, b"\x00" * 8), 400, "length prefixes")
    r = http.post("/v2/models/echo/infer", json=_json_req([1], "FP32", [2**40, 2**40]))
    expect_error(r, 400, "elements")


def test_content_length_over_the_limit_is_413(kserve_server: ServerProcess) -> None:
    with socket.create_connection(
        (kserve_server.host, kserve_server.port), timeout=scaled(10)
    ) as sock:
        sock.sendall(
            b"POST /v2/models/echo/infer HTTP/1.1\r\nHost: x\r\n"
            b"Content-Length: 1099511627776\r\nInference-Header-Content-Length: 10\r\n\r\n"
        )
        data = b""
        while b"\r\n\r\n" not in data or not data.rstrip().endswith(b"}"):
            chunk = sock.recv(65536)
            if not chunk:
                break
            data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 413")
    assert list(json.loads(body)) == ["error"]
    assert httpx.get(kserve_server.url + "/v2/health/live").status_code == 200


def test_unknown_model_version_output(http: httpx.Client) -> None:
    req = _json_req([1.0], "FP32", [1])
    expect_error(http.post("/v2/models/nope/infer", json=req), 404, "not served")
    expect_error(http.post("/v2/models/echo/versions/9/infer", json=req), 404, "version")
    expect_error(http.get("/v2/models/nope"), 404)
    expect_error(http.get("/v2/models/echo/versions/9"), 404)
    assert http.get("/v2/models/nope/ready").status_code == 404
    r = http.post("/v2/models/echo/infer", json={**req, "outputs": [{"name": "zz"}]})
    expect_error(r, 400, "unexpected inference output")
    r = http.post("/v2/models/echo/infer", json={**req, "outputs": [{"name": "x"}, {"name": "x"}]})
    expect_error(r, 400, "twice")
    r = http.post(
        "/v2/models/echo/infer",
        json={**req, "outputs": [{"name": "x", "parameters": {"shared_memory_region": "r"}}]},
    )
    expect_error(r, 400, "shared-memory")
    expect_error(http.get("/v2/models/echo/infer"), 405)
    expect_error(http.post("/v2/nothing/here"), 404)
    r = http.post("/v2/models/echo/infer", content=b"x", headers={"Content-Encoding": "br"})
    expect_error(r, 415, "Content-Encoding")


def test_no_content_type_and_plain_json(http: httpx.Client) -> None:
    """Requests without Content-Type (httpx sends none for raw content) work, and the JSON
    form round-trips nested data, the id, and every output by default."""
    req = {
        "id": "q-1",
        "inputs": [{"name": "m", "datatype": "INT64", "shape": [2, 2], "data": [[1, -2], [3, 4]]}],
    }
    r = http.post("/v2/models/echo/infer", content=json.dumps(req).encode())
    assert r.status_code == 200 and IHCL.lower() not in r.headers
    assert r.headers["content-type"] == "application/json"
    assert r.json() == {
        "model_name": "echo",
        "model_version": "1",
        "id": "q-1",
        "outputs": [{"name": "m", "datatype": "INT64", "shape": [2, 2], "data": [1, -2, 3, 4]}],
    }


def test_binary_response_layout(http: httpx.Client) -> None:
    """The response is the JSON header then each binary output's bytes, in output order,
    with Inference-Header-Content-Length giving the header's size."""
    a = np.arange(6, dtype=np.int16)
    b = np.array([True, False, True])
    header = {
        "inputs": [
            {
                "name": "a",
                "datatype": "INT16",
                "shape": [2, 3],
                "parameters": {"binary_data_size": a.nbytes},
            },
            {"name": "b", "datatype": "BOOL", "shape": [3], "parameters": {"binary_data_size": 3}},
        ],
        "parameters": {"binary_data_output": True},
    }
    r = post_binary(http, header, a.tobytes(), b.tobytes())
    assert r.status_code == 200
    n = int(r.headers[IHCL])
    assert r.headers["content-type"] == "application/octet-stream"
    meta = json.loads(r.content[:n])
    assert [o["parameters"]["binary_data_size"] for o in meta["outputs"]] == [12, 3]
    assert r.content[n:] == a.tobytes() + b.tobytes()
    assert "data" not in meta["outputs"][0]


def test_health_endpoints_raw(http: httpx.Client) -> None:
    assert http.get("/v2/health/live").json() == {"live": True}
    assert http.get("/v2/health/ready").json() == {"ready": True}
    assert http.get("/v2/models/echo/ready").json() == {"name": "echo", "ready": True}
    assert http.get("/v2/models/echo/versions/1/ready").status_code == 200
    assert http.get("/v2/models/echo/versions/2/ready").status_code == 404
    assert http.head("/v2/health/live").status_code == 200
    meta = http.get("/v2").json()
    assert meta["name"] == "zeroserve" and meta["extensions"] == ["binary_tensor_data"]
