"""``--model NAME=hf:ORG/REPO:FILE`` at start (docs/models.md, "Pulling models"): pulled
into the cache through the loopback hub only with ``--allow-pull``, then served; without
the flag, or with a wrong pin, the server does not start and says why."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path

import openai
import pytest

from tests.support import scaled, serve_argv, server_env, start_server
from tests.support.hub import REPO, LoopbackHub, loopback_hub
from zeroserve.models.llamacpp import SMOLLM2_FILE, SMOLLM2_SHA256

pytest.importorskip("xllamacpp")
pytest.importorskip("huggingface_hub")

SOURCE = f"hf:{REPO}:{SMOLLM2_FILE}"
# The longest a start may take on a loaded machine (the pull is a local copy).
START_S = 120.0


@pytest.fixture
def hub() -> Iterator[LoopbackHub]:
    with loopback_hub() as server:
        yield server


def _env(hub: LoopbackHub, cache: Path) -> dict[str, str]:
    return {"HF_ENDPOINT": hub.url, "ZEROSERVE_CACHE": str(cache)}


def _refused(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(
        serve_argv(*args),
        env=server_env(env),
        capture_output=True,
        text=True,
        timeout=scaled(START_S),
        check=False,
    )
    assert done.returncode == 2, done.stderr
    return done


def test_without_allow_pull_nothing_is_fetched_and_the_error_names_the_flag(
    hub: LoopbackHub, tmp_path: Path
) -> None:
    done = _refused("--model", f"small={SOURCE}", env=_env(hub, tmp_path))
    assert "--allow-pull" in done.stderr and SOURCE in done.stderr
    assert hub.log == [] and not any(tmp_path.rglob("*.gguf"))


def test_with_allow_pull_the_model_is_pulled_and_served(hub: LoopbackHub, tmp_path: Path) -> None:
    spec = f"small={SOURCE}?sha256={SMOLLM2_SHA256}&n_ctx=512"
    server = start_server("--model", spec, "--allow-pull", env=_env(hub, tmp_path))
    try:
        client = openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0)
        assert [m.id for m in client.models.list().data] == ["small"]
        answer = client.chat.completions.create(
            model="small", messages=[{"role": "user", "content": "Say hi"}], max_tokens=4
        )
        assert answer.choices[0].message.content
    finally:
        assert server.stop() == 0
    assert [p.name for p in tmp_path.rglob("*.gguf")] == [SMOLLM2_FILE]
    assert any(method == "GET" and SMOLLM2_FILE in path for method, path, _ in hub.log)


def test_a_wrong_pin_stops_the_start_naming_both_hashes(hub: LoopbackHub, tmp_path: Path) -> None:
    wrong = "1" * 64
    done = _refused(
        "--model", f"small={SOURCE}?sha256={wrong}", "--allow-pull", env=_env(hub, tmp_path)
    )
    assert wrong in done.stderr and SMOLLM2_SHA256 in done.stderr
    assert not any(tmp_path.rglob("*.gguf"))
