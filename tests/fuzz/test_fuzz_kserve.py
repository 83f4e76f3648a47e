"""Hostile KServe V2 requests, JSON and binary (headers, ``binary_data_size``, shapes,
dtypes, BYTES framing), through the real server: always a 2xx or a V2-format 4xx."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st
from tests.fuzz import strategies as fs
from tests.fuzz.checks import assert_answer
from tests.fuzz.conftest import Target

_MODELS = st.sampled_from(["echo", "echo-thread"])


@given(body=fs.v2_json_bodies(), model=_MODELS)
def test_v2_json_bodies(target: Target, body: bytes, model: str) -> None:
    r = target.send("POST", f"/v2/models/{model}/infer", body)
    assert_answer(target, r, "kserve", timed=b"timeout" in body)


@given(case=fs.v2_binary_bodies(), model=_MODELS, gzip=st.booleans())
def test_v2_binary_bodies(target: Target, case: tuple[bytes, str], model: str, gzip: bool) -> None:
    body, length = case
    headers = {"inference-header-content-length": length.encode()}
    if gzip:
        headers["content-encoding"] = b"gzip"  # a body that is not gzip: refused, not a 500
    r = target.send("POST", f"/v2/models/{model}/infer", body, headers=headers)
    assert_answer(target, r, "kserve", timed=b"timeout" in body)
