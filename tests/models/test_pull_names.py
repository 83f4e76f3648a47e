"""The cache's name index, without a server (docs/models.md, "Pulled models in the
catalog"): ``zeroserve pull --name`` against the loopback hub, ``list`` and ``rm`` by name,
a name whose file is gone, and a corrupt index read as file names."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.hub import REPO, LoopbackHub, loopback_hub
from zeroserve.cli import main
from zeroserve.models.cache import NAMES_FILE, cached_models, catalog_models, read_names
from zeroserve.models.llamacpp import SMOLLM2_FILE, SMOLLM2_SHA256

pytest.importorskip("huggingface_hub")

SOURCE = f"hf:{REPO}:{SMOLLM2_FILE}?sha256={SMOLLM2_SHA256}"
STEM = SMOLLM2_FILE.removesuffix(".gguf")


@pytest.fixture
def hub(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[LoopbackHub]:
    with loopback_hub() as server:
        monkeypatch.setenv("HF_ENDPOINT", server.url)
        monkeypatch.setenv("ZEROSERVE_CACHE", str(tmp_path))
        yield server


def _listed(capsys: pytest.CaptureFixture[str]) -> list[str]:
    capsys.readouterr()
    assert main(["list"]) == 0
    return [line.split("\t")[0] for line in capsys.readouterr().out.splitlines()]


def test_rm_takes_a_name_and_the_file_with_its_last_name(
    hub: LoopbackHub, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["pull", SOURCE, "--name", "bad/name"]) == 1  # refused before any fetch
    assert "bad model name" in capsys.readouterr().err and hub.log == []
    assert main(["pull", SOURCE, "--name", "chat"]) == 0
    path = Path(capsys.readouterr().out.strip())
    assert main(["pull", SOURCE, "--name", "small"]) == 0  # cached: a second name
    assert [m for m, p, _ in hub.log if m == "GET" and p.endswith(SMOLLM2_FILE)] == ["GET"]
    # The file goes by its names only, in `list` and in the catalog.
    assert _listed(capsys) == ["chat", "small"]
    assert catalog_models(tmp_path) == {"chat": path, "small": path}
    assert main(["rm", STEM]) == 1  # not a name it goes by
    # `rm` of one name keeps the file for the other; of the last, deletes it and its blob.
    blob = path.resolve()
    assert main(["rm", "chat"]) == 0
    assert _listed(capsys) == ["small"] and blob.is_file()
    assert main(["rm", "small"]) == 0
    assert _listed(capsys) == [] and not path.exists() and not blob.exists()
    assert read_names(tmp_path) == {}
    assert main(["rm", "small"]) == 1
    assert "no cached model named 'small'" in capsys.readouterr().err


def test_a_name_whose_file_is_gone_is_dropped_at_the_next_scan(
    hub: LoopbackHub, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["pull", SOURCE, "--name", "chat"]) == 0
    path = Path(capsys.readouterr().out.strip())
    assert list(read_names(tmp_path)) == ["chat"]
    path.resolve().unlink()  # deleted by hand
    path.unlink()
    assert catalog_models(tmp_path) == {}
    assert read_names(tmp_path) == {}
    # Pulled again without a name, it goes by its file's name, not by the stale one.
    assert main(["pull", SOURCE]) == 0
    assert _listed(capsys) == [STEM]


@pytest.mark.parametrize(
    "index",
    [
        b"{not json",
        b"\xff\xfe",
        b'{"version": 1, "names": []}',
        b'{"version": 2, "names": {}}',
        b'{"version": 1, "names": {"x": {"path": "../outside.gguf", "source": "s"}}}',
        b'{"version": 1, "names": {"a b": {"path": "x.gguf", "source": "s"}}}',
    ],
)
def test_a_corrupt_index_falls_back_to_file_names(
    hub: LoopbackHub,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    caplog: pytest.LogCaptureFixture,
    index: bytes,
) -> None:
    assert main(["pull", SOURCE, "--name", "chat"]) == 0
    path = Path(capsys.readouterr().out.strip())
    (tmp_path / NAMES_FILE).write_bytes(index)
    with caplog.at_level(logging.WARNING, logger="zeroserve"):
        assert catalog_models(tmp_path) == {STEM: path}
        assert cached_models(tmp_path) == [(STEM, path)]
    assert "corrupt name index" in caplog.text
    # The next write (an `rm`, even of nothing) keeps the bad index beside a fresh one.
    assert main(["rm", "nothing"]) == 1
    assert (tmp_path / (NAMES_FILE + ".bad")).read_bytes() == index
    assert json.loads((tmp_path / NAMES_FILE).read_text())["names"] == {}
    assert main(["pull", SOURCE, "--name", "small"]) == 0
    assert catalog_models(tmp_path) == {"small": path}
    written = json.loads((tmp_path / NAMES_FILE).read_text())
    assert written["names"]["small"]["source"] == SOURCE
