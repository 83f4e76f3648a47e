"""``--models-memory`` through a real server (docs/models.md, "Memory"): SmolLM2's load is
measured and exported, the cap is exported, and over the cap the idle model is unloaded
for the next one."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest

from tests.support import model_scaled, scaled, start_server, wait_until

pytest.importorskip("xllamacpp")

from zeroserve.models.llamacpp import smollm2_path
from zeroserve.runtime.model_memory import gguf_estimate

LOAD_WAIT_S = 60.0


def _metric(url: str, line_start: str) -> float:
    for line in httpx.get(url + "/metrics").text.splitlines():
        if line.startswith(line_start + " "):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"{line_start} is not in /metrics")


# Its loads and its chat run on SmolLM2's niced threads: bounded by model_scaled, and
# pytest-timeout by model_slowdown (docs/decisions/0055-model-waits-scaled-for-the-niced-share.md).
@pytest.mark.niced
def test_a_loads_memory_is_measured_and_over_the_cap_the_idle_model_goes(
    tmp_path: Path,
) -> None:
    models = tmp_path / "models"
    models.mkdir()
    for name in ("small", "other"):
        (models / f"{name}.gguf").symlink_to(smollm2_path())
    estimate = gguf_estimate(smollm2_path(), 4096)
    # Room for one SmolLM2 as estimated, and not for another beside a measured one.
    log = tmp_path / "access.jsonl"
    server = start_server(
        "--models-dir",
        str(models),
        "--models-memory",
        str(estimate + 1),
        "--access-log",
        str(log),
    )
    url = server.url
    try:
        assert _metric(url, "zeroserve_models_memory_cap_bytes") == estimate + 1
        assert _metric(url, "zeroserve_models_memory_used_bytes") == 0
        with httpx.Client(timeout=model_scaled(LOAD_WAIT_S)) as http:
            assert http.post(url + "/models/load", json={"model": "small"}).status_code == 200
            used = _metric(url, 'zeroserve_model_memory_bytes{name="small"}')
            assert used > 0 and _metric(url, "zeroserve_models_memory_used_bytes") == used
            r = http.post(
                url + "/v1/chat/completions",
                json={"model": "other", "messages": [{"role": "user", "content": "Hi"}]},
            )
            assert r.status_code == 200  # small was idle: it made room
        states = {m["id"]: m["status"]["value"] for m in httpx.get(url + "/models").json()["data"]}
        assert states == {"small": "unloaded", "other": "loaded"}
        assert _metric(url, 'zeroserve_model_evictions_total{name="small"}') == 1
        assert _metric(url, 'zeroserve_model_memory_bytes{name="small"}') == 0
    finally:
        assert server.stop() == 0
    records = [json.loads(line) for line in log.read_text().splitlines()]
    chat = [r for r in records if r["path"] == "/v1/chat/completions"]
    # The request that loaded its model says how long it waited for the load.
    assert len(chat) == 1 and chat[0]["status"] == 200 and chat[0]["load_wait_s"] > 0
    assert all("load_wait_s" not in r for r in records if r["path"] != "/v1/chat/completions")


def test_the_flag_takes_units_and_refuses_what_is_not_a_size() -> None:
    from zeroserve.cli import build_parser

    parser = build_parser()
    args = parser.parse_args(["serve", "--models-memory", "512M"])
    assert args.models_memory == 512 << 20
    assert parser.parse_args(["serve", "--models-memory", "8g"]).models_memory == 8 << 30
    with pytest.raises(SystemExit):
        parser.parse_args(["serve", "--models-memory", "lots"])


def test_a_requests_keep_alive_is_ollamas(tmp_path: Path) -> None:
    models = tmp_path / "models"
    (models / "twin").mkdir(parents=True)
    (models / "twin" / "model.toml").write_text('spec = "echo"\n')
    server = start_server("--models-dir", str(models), "--model", "echo", "--keep-alive", "1h")
    url = server.url
    chat = {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2}

    def state() -> str:
        listed = httpx.get(url + "/models").json()["data"]
        return str({m["id"]: m["status"]["value"] for m in listed}["twin"])

    try:
        with httpx.Client(base_url=url, timeout=scaled(LOAD_WAIT_S)) as http:
            r = http.post("/v1/embeddings", json={"model": "twin", "input": "x", "keep_alive": 0})
            assert r.status_code == 200  # loaded for it, unloaded once idle
            wait_until(lambda: state() == "unloaded", 30, "the keep_alive 0 unload")
            r = http.post(
                "/v1/chat/completions", json={**chat, "model": "twin", "keep_alive": "-1"}
            )
            assert r.status_code == 200 and state() == "loaded"
            r = http.post("/v1/messages", json={**chat, "model": "twin", "keep_alive": "90s"})
            assert r.status_code == 200
            r = http.post(
                "/v1/chat/completions", json={**chat, "model": "twin", "keep_alive": "5 minutes"}
            )
            assert r.status_code == 400 and r.json()["error"]["param"] == "keep_alive"
            r = http.post(
                "/v1/chat/completions", json={**chat, "model": "echo", "keep_alive": "5m"}
            )
            assert r.status_code == 400 and r.json()["error"]["param"] == "keep_alive"
            assert "'echo' is pinned" in r.json()["error"]["message"]
    finally:
        assert server.stop() == 0
