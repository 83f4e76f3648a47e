"""The pull cache in the catalog, without a server (docs/models.md, "Pulled models in the
catalog"): which cached files become which entries, explicit entries winning, what a
rescan drops, and when a server serves the cache at all."""

from __future__ import annotations

import os
import warnings
from pathlib import Path

import pytest

from zeroserve.cli import main
from zeroserve.config import load_config
from zeroserve.errors import ConfigError
from zeroserve.models.cache import cached_models, catalog_models
from zeroserve.models.catalog import CatalogEntry, server_catalog
from zeroserve.models.loader import parse_spec
from zeroserve.runtime.model_pulls import dropped_at_rescan


def _hf_file(cache: Path, repo: str, name: str, data: bytes, written: float) -> Path:
    """A file laid out as huggingface_hub caches it: a snapshot link to a blob."""
    folder = cache / "hf" / f"models--{repo.replace('/', '--')}"
    blob = folder / "blobs" / "0123abcd"
    blob.parent.mkdir(parents=True, exist_ok=True)
    blob.write_bytes(data)
    os.utime(blob, (written, written))
    link = folder / "snapshots" / ("c" * 40) / name
    link.parent.mkdir(parents=True, exist_ok=True)
    link.symlink_to(blob)
    return link


def _url_file(cache: Path, name: str, written: float = 1_000.0) -> Path:
    path = cache / "url" / "host.example" / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"GGUF")
    os.utime(path, (written, written))
    return path


def test_each_cached_model_is_named_as_zeroserve_list_names_it(tmp_path: Path) -> None:
    chat = _hf_file(tmp_path, "org/chat", "Chat.Q4_K_M.gguf", b"GGUF1", 1_000.0)
    other = _url_file(tmp_path, "other.gguf")
    _url_file(tmp_path, "partial.gguf.part")  # a download in progress: no model
    _url_file(tmp_path, "mmproj-chat-f16.gguf")  # a projector: listed, not served
    _url_file(tmp_path, "bad name.gguf")  # no model name: listed, not served
    assert catalog_models(tmp_path) == {"Chat.Q4_K_M": chat, "other": other}
    listed = [name for name, _ in cached_models(tmp_path)]
    assert listed == ["Chat.Q4_K_M", "bad name", "mmproj-chat-f16", "other"]
    assert catalog_models(tmp_path / "none") == {}  # no cache yet: nothing


def test_two_files_with_one_name_the_one_written_last_is_served(tmp_path: Path) -> None:
    old = _hf_file(tmp_path, "org/a", "model.gguf", b"GGUF-a", 1_000.0)
    new = _hf_file(tmp_path, "org/b", "model.gguf", b"GGUF-b", 2_000.0)
    assert catalog_models(tmp_path) == {"model": new}
    os.utime(new.resolve(), (500.0, 500.0))
    assert catalog_models(tmp_path) == {"model": old}
    os.utime(new.resolve(), (1_000.0, 1_000.0))  # a tie: the first path in sorted order
    assert catalog_models(tmp_path) == {"model": old}


def test_explicit_entries_win_over_the_cache(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    chat = _hf_file(cache, "org/chat", "chat.gguf", b"GGUF1", 1_000.0)
    _url_file(cache, "twin.gguf")
    _url_file(cache, "solo.gguf")
    models = tmp_path / "models"
    models.mkdir()
    (models / "twin.gguf").write_bytes(b"GGUF")
    # A --model serving the cached file under its own name (pulled at start).
    refs = [parse_spec(f"mine=llamacpp:{chat}"), parse_spec("echo")]
    catalog = server_catalog(refs, models, cache)
    assert sorted(catalog) == ["echo", "mine", "solo", "twin"]
    assert catalog["twin"].origin == str(models / "twin.gguf")  # the models dir's
    assert catalog["solo"].origin == str(cache / "url" / "host.example" / "solo.gguf")
    assert catalog["solo"].ref.options["location"] == catalog["solo"].origin
    assert not catalog["solo"].pin
    # A --model named as a cached file: the --model.
    catalog = server_catalog([parse_spec("solo=echo?size=1")], None, cache)
    assert catalog["solo"].origin == "--model" and "chat" in catalog
    # Not served: no cache entries.
    assert sorted(server_catalog(refs, models, None)) == ["echo", "mine", "twin"]


def test_a_rescan_drops_a_pulled_entry_once_its_file_is_gone(tmp_path: Path) -> None:
    kept, gone = tmp_path / "kept.gguf", tmp_path / "gone.gguf"
    kept.write_bytes(b"GGUF")
    entries = {
        "kept": CatalogEntry(parse_spec(f"kept=llamacpp:{kept}"), origin="POST /models/pull"),
        "gone": CatalogEntry(parse_spec(f"gone=llamacpp:{gone}"), origin="POST /models/pull"),
        "old": CatalogEntry(parse_spec(f"old=llamacpp:{kept}"), origin=str(kept)),
        "echo": CatalogEntry(parse_spec("echo"), origin="--model"),
    }
    found = {"echo": entries["echo"]}
    added = {"kept", "gone"}
    assert dropped_at_rescan(entries, found, added) == ["gone", "old"]


def test_when_a_server_serves_the_cache(tmp_path: Path) -> None:
    def serves(allow_pull: bool = False, **overrides: object) -> bool:
        return load_config(None, env={}, overrides=overrides).serves_cache(allow_pull)

    assert not serves()  # only --model specs: a shared cache stays out
    assert serves(models_dir=str(tmp_path)) and serves(allow_pull=True)
    assert not serves(allow_pull=True, workers=2)  # the default follows one process
    assert serves(serve_cache=True) and not serves(serve_cache=False, models_dir=".")
    with pytest.raises(ConfigError, match="'serve_cache': needs workers = 1"):
        serves(serve_cache=True, workers=2)
    # The cache's own variables are no configuration keys: no warning names them.
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        load_config(None, env={"ZEROSERVE_CACHE": "/c", "ZEROSERVE_PULL_ALLOW_HTTP": "1"})


def test_zeroserve_models_lists_the_cache_with_the_flag(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip("xllamacpp")
    monkeypatch.setenv("ZEROSERVE_CACHE", str(tmp_path))
    _url_file(tmp_path, "cached.gguf")
    assert main(["models", "--model", "echo"]) == 0
    assert "cached" not in capsys.readouterr().out
    assert main(["models", "--model", "echo", "--serve-cache"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split()[0] for line in lines] == ["echo", "cached"]
    assert "on demand" in lines[1]
