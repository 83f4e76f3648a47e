"""Zero copy, shown: a binary input reaches the model as a view into the shared-memory
arena the body was received into (``Probe`` checks the array's memory from inside the
model), on the inline and the process executors, and the server's copy counters for the
V2 layer and the process hand-off stay at zero."""

from __future__ import annotations

import numpy as np
import pytest

from tests.app.kserve.conftest import copied_by_site
from tests.support import ServerProcess

httpclient = pytest.importorskip("tritonclient.http")

# Sites that would count a copy of a numeric binary tensor on its way to the model.
NUMERIC_COPY_SITES = ("kserve_json_in", "kserve_contiguous", "kserve_inflate", "process_input")


def run_probe(server: ServerProcess, model: str, x: np.ndarray) -> object:
    client = httpclient.InferenceServerClient(f"{server.host}:{server.port}")
    try:
        inp = httpclient.InferInput("X", list(x.shape), "FP32")
        inp.set_data_from_numpy(x)
        return client.infer(model, [inp])
    finally:
        client.close()


def check_zero_copy(server: ServerProcess, model: str) -> None:
    x = np.random.default_rng(2).standard_normal((512, 512)).astype(np.float32)  # 1 MiB
    before = copied_by_site(server)
    for _ in range(3):
        result = run_probe(server, model, x)
        assert result.as_numpy("X__shared").tolist() == [True]
        np.testing.assert_array_equal(result.as_numpy("X"), x)
    after = copied_by_site(server)
    for site in NUMERIC_COPY_SITES:
        assert after.get(site, 0) == before.get(site, 0), site
    # What is left: body bytes that arrived in the same read as the head, and (process
    # executor) the probe's own 1-byte flag output written into shared memory.
    allowed = ("head_overflow", "process_output")
    other = {k: v - before.get(k, 0) for k, v in after.items() if k not in allowed}
    assert not any(other.values()), other
    assert sum(after.values()) - sum(before.values()) <= 0.02 * 3 * x.nbytes


def test_inline_executor_gets_a_view_of_the_body(kserve_server: ServerProcess) -> None:
    check_zero_copy(kserve_server, "probe")


def test_process_executor_gets_a_view_of_the_body(process_server: ServerProcess) -> None:
    check_zero_copy(process_server, "probe_proc")


def test_json_input_is_not_a_view(kserve_server: ServerProcess) -> None:
    """The probe can tell: a JSON input is a fresh array (the control experiment)."""
    client = httpclient.InferenceServerClient(f"{kserve_server.host}:{kserve_server.port}")
    try:
        inp = httpclient.InferInput("X", [4], "FP32")
        inp.set_data_from_numpy(np.ones(4, np.float32), binary_data=False)
        assert client.infer("probe", [inp]).as_numpy("X__shared").tolist() == [False]
    finally:
        client.close()
