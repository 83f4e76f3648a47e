"""hf: pulls against a loopback hub (HF_ENDPOINT) serving the real SmolLM2 GGUF."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support import scaled
from tests.support.hub import REPO, LoopbackHub, loopback_hub
from zeroserve.errors import RequestError
from zeroserve.models.cache import HashMismatch, cached_models
from zeroserve.models.llamacpp import SMOLLM2_FILE, SMOLLM2_SHA256
from zeroserve.models.pull import pull


@pytest.fixture
def hub(monkeypatch: pytest.MonkeyPatch) -> Iterator[LoopbackHub]:
    with loopback_hub() as server:
        monkeypatch.setenv("HF_ENDPOINT", server.url)
        yield server


def test_pull_by_file_with_pin(hub: LoopbackHub, tmp_path: Path) -> None:
    path = pull(f"hf:{REPO}:{SMOLLM2_FILE}?sha256={SMOLLM2_SHA256}", tmp_path)
    assert path.read_bytes() == hub.files[SMOLLM2_FILE]
    assert [n for n, _ in cached_models(tmp_path)] == [Path(SMOLLM2_FILE).stem]


def test_pull_by_quant_and_by_sole_gguf(hub: LoopbackHub, tmp_path: Path) -> None:
    assert pull(f"hf:{REPO}:q4_1", tmp_path).name == SMOLLM2_FILE
    assert pull(f"hf:{REPO}", tmp_path).name == SMOLLM2_FILE


def test_unmatched_quant_lists_choices(hub: LoopbackHub, tmp_path: Path) -> None:
    with pytest.raises(RequestError, match=r"matches 0 GGUF files; choose one of: .*Q4_1\.gguf"):
        pull(f"hf:{REPO}:Q8_0", tmp_path)


def test_wrong_pin_deletes_and_names_both(hub: LoopbackHub, tmp_path: Path) -> None:
    wrong = "1" * 64
    with pytest.raises(HashMismatch) as info:
        pull(f"hf:{REPO}:{SMOLLM2_FILE}?sha256={wrong}", tmp_path)
    assert wrong in str(info.value) and SMOLLM2_SHA256 in str(info.value)
    assert cached_models(tmp_path) == []


def test_offline_uses_the_cache_without_the_hub(hub: LoopbackHub, tmp_path: Path) -> None:
    import os
    import subprocess
    import sys

    source = f"hf:{REPO}:{SMOLLM2_FILE}"
    first = pull(source, tmp_path)
    env = dict(os.environ, HF_HUB_OFFLINE="1", ZEROSERVE_CACHE=str(tmp_path))
    env["HF_ENDPOINT"] = "http://127.0.0.1:9"  # nothing listens: any fetch would fail
    seen = len(hub.log)
    done = subprocess.run(
        [sys.executable, "-m", "zeroserve", "pull", source],
        env=env,
        capture_output=True,
        text=True,
        timeout=scaled(120),
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == str(first)
    assert len(hub.log) == seen
