"""Hostile KServe V2 requests, JSON and binary (headers, ``binary_data_size``, shapes,
dtypes, BYTES framing, gzip), through the real server: always a 2xx or a V2-format 4xx."""

from __future__ import annotations

import gzip

from hypothesis import given
from hypothesis import strategies as st

from tests.fuzz import strategies as fs
from tests.fuzz.checks import assert_answer
from tests.fuzz.conftest import Target

_MODELS = st.sampled_from(["echo", "echo-thread"])
# The unversioned route, or a versioned one (the model's own version, or another).
_VERSIONS = st.sampled_from(["", "", "", "/versions/1", "/versions/2", "/versions/%00"])
# No encoding, a body that claims gzip but is not, or a real gzip of the body.
_ENCODINGS = st.sampled_from(["", "fake-gzip", "gzip"])


def _path(model: str, version: str) -> str:
    return f"/v2/models/{model}{version}/infer"


@given(body=fs.v2_json_bodies(), model=_MODELS, version=_VERSIONS)
def test_v2_json_bodies(target: Target, body: bytes, model: str, version: str) -> None:
    r = target.send("POST", _path(model, version), body)
    assert_answer(target, r, "kserve", timed=b"timeout" in body)


@given(case=fs.v2_binary_bodies(), model=_MODELS, version=_VERSIONS, encoding=_ENCODINGS)
def test_v2_binary_bodies(
    target: Target, case: tuple[bytes, str], model: str, version: str, encoding: str
) -> None:
    body, length = case
    timed = b"timeout" in body
    headers = {"inference-header-content-length": length.encode()}
    if encoding:
        headers["content-encoding"] = b"gzip"
    if encoding == "gzip":
        body = gzip.compress(body)
    r = target.send("POST", _path(model, version), body, headers=headers)
    assert_answer(target, r, "kserve", timed=timed)
