"""Metrics conventions on a real scrape (promtool), and one view over --workers N."""

from __future__ import annotations

import re
import shutil
import subprocess
import time
from pathlib import Path

import httpx
import pytest

from tests.support import scaled, start_server
from zeroserve import metrics

# A server that does not show both its processes in this long has failed, not slowed down.
WORKERS_UP_TIMEOUT_S = scaled(60.0)
RAW_ROUTE = 'zeroserve_http_requests_total{route="/v1/raw/{model}",status="200"}'


def sample(text: str, name: str) -> float:
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def test_merge_sums_counters_and_histograms_and_keeps_types() -> None:
    a = (
        b'# HELP x_total things\n# TYPE x_total counter\nx_total{k="a"} 2.0\n'
        b"# HELP g gauge\n# TYPE g gauge\ng 3.0\n"
        b'# HELP h h\n# TYPE h histogram\nh_bucket{le="1.0"} 1.0\nh_bucket{le="+Inf"} 2.0\n'
        b"h_count 2.0\nh_sum 1.5\nh_created 100.0\n"
    )
    b = (
        b'# HELP x_total things\n# TYPE x_total counter\nx_total{k="a"} 5.0\nx_total{k="b"} 1.0\n'
        b"# HELP g gauge\n# TYPE g gauge\ng 4.0\n"
        b'# HELP h h\n# TYPE h histogram\nh_bucket{le="1.0"} 0.0\nh_bucket{le="+Inf"} 1.0\n'
        b"h_count 1.0\nh_sum 3.0\nh_created 50.0\n"
    )
    text = metrics.merge_expositions([a, b]).decode()
    assert sample(text, 'x_total{k="a"}') == 7 and sample(text, 'x_total{k="b"}') == 1
    assert sample(text, "g") == 7
    assert sample(text, 'h_bucket{le="+Inf"}') == 3 and sample(text, "h_sum") == 4.5
    assert sample(text, "h_created") == 50
    assert "# TYPE x_total counter" in text and "# TYPE h histogram" in text
    assert sample(text, "zeroserve_metrics_processes") == 2


def test_workers_share_one_metrics_view() -> None:
    server = start_server("--workers", "2", "--model", "echo")
    try:
        url = server.url
        deadline = time.monotonic() + WORKERS_UP_TIMEOUT_S
        while True:  # the second process may still be loading when the first prints
            text = httpx.get(url + "/metrics").text
            if sample(text, "zeroserve_metrics_processes") == 2:
                break
            assert time.monotonic() < deadline, "the second worker never joined the view"
        before = sample(text, RAW_ROUTE)
        sent = 40
        for _ in range(sent):  # a new connection each: SO_REUSEPORT spreads them
            r = httpx.post(url + "/v1/raw/echo", content=b"hi", headers={"connection": "close"})
            assert r.content == b"hi"
        # Every scrape, whichever process answers it, counts every request.
        for _ in range(6):
            text = httpx.get(url + "/metrics", headers={"connection": "close"}).text
            assert sample(text, "zeroserve_metrics_processes") == 2
            assert sample(text, RAW_ROUTE) - before == sent
    finally:
        assert server.stop() == 0
    promtool = shutil.which("promtool")
    if promtool is not None:  # the summed view is valid exposition too
        result = subprocess.run(
            [promtool, "check", "metrics"],
            input=text,
            capture_output=True,
            text=True,
            timeout=scaled(60),
        )
        assert result.returncode == 0, result.stdout + result.stderr


def test_promtool_accepts_a_real_scrape(tmp_path: Path) -> None:
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip(
            "promtool (Debian package 'prometheus') is not installed; `make test` installs it"
        )
    keys = tmp_path / "keys.toml"
    keys.write_text('[keys.ci]\nkey = "sk-promtool-1"\nrequests_per_minute = 100\n')
    server = start_server("--model", "echo", "--api-keys-file", str(keys))
    try:
        key = {"authorization": "Bearer sk-promtool-1"}
        assert httpx.post(server.url + "/v1/raw/echo", content=b"x", headers=key).status_code == 200
        text = httpx.get(server.url + "/metrics").text
    finally:
        assert server.stop() == 0
    for name in (
        "zeroserve_queue_admitted",
        "zeroserve_queue_rejected",
        "zeroserve_queue_completed",
        "zeroserve_batch_batches",
        "zeroserve_workers_restarts",
        "zeroserve_workers_crashes",
        "zeroserve_arena_allocations",
        "zeroserve_api_key_requests",
    ):
        assert f"# TYPE {name}_total counter" in text, name
    assert 'zeroserve_api_key_requests_total{key="ci"} 1.0' in text
    assert not re.search(r"^zeroserve_arena_(budget|used|peak) ", text, re.M)
    result = subprocess.run(
        [promtool, "check", "metrics"],
        input=text,
        capture_output=True,
        text=True,
        timeout=scaled(60),
    )
    assert result.returncode == 0, result.stdout + result.stderr
