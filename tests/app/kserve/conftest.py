"""Fixtures of the KServe suite: real servers on loopback (each suite runs on uvloop and on
asyncio through the root ``loop_name`` fixture), and ONNX graphs built for the session."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.support import ServerProcess, start_server
from tests.support.models import onnx_graphs as om


@pytest.fixture(scope="session")
def onnx_files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    pytest.importorskip("onnx")
    d = tmp_path_factory.mktemp("kserve-onnx")
    return {"mm": om.matmul_bias(d / "mm.onnx"), "cls": om.softmax_classifier(d / "cls.onnx")}


@pytest.fixture(scope="session")
def kserve_server(loop_name: str, onnx_files: dict[str, Path]) -> Iterator[ServerProcess]:
    server = start_server(
        "--model", "echo",
        "--model", "probe=tests.support.models.kserve:Probe",
        "--model", f"mm=onnx:{onnx_files['mm']}",
        "--model", f"cls=onnx:{onnx_files['cls']}?max_batch_size=8",
        loop=loop_name,
    )  # fmt: skip
    yield server
    assert server.stop() == 0


@pytest.fixture(scope="session")
def process_server(loop_name: str) -> Iterator[ServerProcess]:
    """The probe model on the process executor (its own server: workers are spawned)."""
    server = start_server(
        "--model", "probe_proc=tests.support.models.kserve:Probe?executor=process",
        loop=loop_name,
    )  # fmt: skip
    yield server
    assert server.stop() == 0


_SITE = re.compile(r'^zeroserve_copied_bytes_total\{site="([^"]+)"\}\s+(\S+)$', re.M)


def copied_by_site(server: ServerProcess) -> dict[str, float]:
    """Bytes copied so far, per copy site, from the server's ``/metrics``."""
    text = httpx.get(server.url + "/metrics").text
    return {site: float(value) for site, value in _SITE.findall(text)}
