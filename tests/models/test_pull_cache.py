"""The model cache's offline parts: source syntax, cache root, sha256 pins, cached_models()."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from zeroserve.errors import RequestError
from zeroserve.models.cache import (
    HashMismatch,
    PullSource,
    cache_dir,
    cached_models,
    parse_source,
    verify_pin,
)

PIN = "ab" * 32


def test_parse_hf_sources() -> None:
    assert parse_source("hf:org/repo") == PullSource("hf", "org/repo", "", None)
    assert parse_source("hf:org/repo:Q4_K_M") == PullSource("hf", "org/repo", "Q4_K_M", None)
    assert parse_source(f"hf:org/repo:m.gguf?sha256={PIN.upper()}") == PullSource(
        "hf", "org/repo", "m.gguf", PIN
    )


def test_parse_url_source() -> None:
    got = parse_source(f"https://h/x.gguf?sha256={PIN}")
    assert got == PullSource("url", "", "https://h/x.gguf", PIN)
    got = parse_source(f"https://h/x.gguf?sig=1&sha256={PIN}")  # after the URL's own query
    assert got == PullSource("url", "", "https://h/x.gguf?sig=1", PIN)


def test_the_pin_is_written_as_a_model_specs_option() -> None:
    with pytest.raises(RequestError, match=r"as a model spec's option, \?sha256=HEX"):
        parse_source(f"hf:org/repo:m.gguf@sha256={PIN}")


@pytest.mark.parametrize(
    "bad", ["hf:repo", "hf:org/repo:../x", "ftp://x", "hf:org/repo?sha256=12", "name"]
)
def test_bad_sources_are_400(bad: str) -> None:
    with pytest.raises(RequestError) as info:
        parse_source(bad)
    assert info.value.status == 400


def test_cache_dir_precedence(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("ZEROSERVE_CACHE", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cache_dir() == tmp_path / "xdg" / "zeroserve"
    monkeypatch.setenv("ZEROSERVE_CACHE", str(tmp_path / "c"))
    assert cache_dir() == tmp_path / "c"


def test_pin_match_and_mismatch(tmp_path: Path) -> None:
    path = tmp_path / "m.gguf"
    path.write_bytes(b"GGUF" * 1000)
    good = hashlib.sha256(path.read_bytes()).hexdigest()
    verify_pin(path, good)
    assert path.exists()
    with pytest.raises(HashMismatch) as info:
        verify_pin(path, PIN)
    assert PIN in str(info.value) and good in str(info.value)
    assert not path.exists()


def test_cached_models_lists_ggufs_not_parts(tmp_path: Path) -> None:
    (tmp_path / "org" / "repo").mkdir(parents=True)
    (tmp_path / "org" / "repo" / "b.gguf").write_bytes(b"x")
    (tmp_path / "a.gguf").write_bytes(b"x")
    (tmp_path / "c.gguf.part").write_bytes(b"x")
    assert [name for name, _ in cached_models(tmp_path)] == ["a", "b"]
    assert cached_models(tmp_path / "missing") == []
