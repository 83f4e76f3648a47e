"""Admission over V2: with the model's queue full, an infer request is refused at its head
with 429, ``Retry-After`` and a KServe error body; the held request still completes."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import httpx

from tests.support import scaled, start_server

WAIT_S = scaled(20.0)


def test_full_queue_gives_429_in_kserve_format(tmp_path: Path) -> None:
    flag = str(tmp_path / "gate")
    server = start_server(
        "--model", f"gate=tests.support.models.kserve:Gate?flag={flag}&queue_depth=1"
    )
    try:
        req = {"inputs": [{"name": "x", "datatype": "INT8", "shape": [1], "data": [7]}]}
        url = server.url + "/v2/models/gate/infer"
        held: list[httpx.Response] = []
        t = threading.Thread(target=lambda: held.append(httpx.post(url, json=req, timeout=WAIT_S)))
        t.start()
        deadline = time.monotonic() + WAIT_S
        while not Path(flag + ".started").exists():  # bounded wait for a condition
            assert time.monotonic() < deadline, "the first request never reached the model"
            time.sleep(0.005)
        r = httpx.post(url, json=req, timeout=WAIT_S)
        assert r.status_code == 429
        assert int(r.headers["retry-after"]) >= 1
        assert list(r.json()) == ["error"]
        Path(flag + ".go").touch()
        t.join(WAIT_S)
        assert held and held[0].status_code == 200
        assert held[0].json()["outputs"][0]["data"] == [7]
        assert httpx.post(url, json=req, timeout=WAIT_S).status_code == 200
    finally:
        assert server.stop() == 0
