"""The catalog (docs/architecture.md, "Models at run time"): a real models directory holding smollm2's GGUF and
model folders is read into entries whose specs build real models."""

from __future__ import annotations

from pathlib import Path

import pytest

from zeroserve.errors import SpecError
from zeroserve.models.catalog import (
    CatalogEntry,
    build_catalog,
    entries_from_specs,
    scan_models_dir,
)
from zeroserve.models.echo import EchoModel
from zeroserve.models.llamacpp import LlamaCppModel, smollm2_path
from zeroserve.models.loader import BACKENDS


def _models_dir(tmp_path: Path) -> Path:
    root = tmp_path / "models"
    root.mkdir()
    (root / "tiny.gguf").symlink_to(smollm2_path())
    mine = root / "mine"
    mine.mkdir()
    (mine / "weights.gguf").symlink_to(smollm2_path())
    (mine / "model.toml").write_text(
        'spec = "llamacpp:weights.gguf"\npin = true\n[options]\nexecutor = "thread"\nn_ctx = 512\n'
    )
    echo = root / "say"
    echo.mkdir()
    (echo / "model.toml").write_text('spec = "echo"\n')
    (root / "notes.txt").write_text("not a model")
    (root / "empty").mkdir()
    return root


def test_a_models_dir_names_gguf_files_and_model_folders(tmp_path: Path) -> None:
    root = _models_dir(tmp_path)
    entries = {e.name: e for e in scan_models_dir(root)}
    assert sorted(entries) == ["mine", "say", "tiny"]

    tiny = entries["tiny"]
    assert tiny.ref.target == BACKENDS["llamacpp"]
    assert tiny.ref.options["location"] == str((root / "tiny.gguf").resolve())
    assert tiny.ref.options["alias"] == "tiny"
    assert tiny.origin == str(root / "tiny.gguf") and not tiny.pin

    mine = entries["mine"]
    assert mine.pin
    assert mine.ref.options["location"] == str((root / "mine" / "weights.gguf").resolve())
    assert mine.ref.options["n_ctx"] == 512
    assert mine.ref.runtime == {"executor": "thread"}

    assert entries["say"].ref.load_class() is EchoModel


def test_a_gguf_entry_builds_the_llamacpp_model_on_that_file(tmp_path: Path) -> None:
    entry = {e.name: e for e in scan_models_dir(_models_dir(tmp_path))}["tiny"]
    model = entry.ref.factory()()
    assert isinstance(model, LlamaCppModel)
    assert Path(model.path).resolve() == Path(smollm2_path()).resolve()


@pytest.mark.parametrize(
    ("text", "fault"),
    [
        ('spec = "echo"\nkeep = 1\n', "unknown key(s) keep"),
        ("pin = true\n", "'spec' must be a non-empty string"),
        ('spec = "echo"\npin = "yes"\n', "'pin' must be true or false"),
        ('spec = "echo?executor=thread"\n', "put options in [options]"),
        ('spec = "echo"\n[options]\nx = [1]\n', "[options] must be a table"),
        ('spec = "nope:"\n', "is not NAME=module:Class"),
        ("spec = \n", "cannot read"),
    ],
)
def test_a_bad_model_toml_is_refused_naming_the_file(tmp_path: Path, text: str, fault: str) -> None:
    folder = tmp_path / "bad"
    folder.mkdir()
    (folder / "model.toml").write_text(text)
    with pytest.raises(SpecError) as info:
        scan_models_dir(tmp_path)
    assert str(folder / "model.toml") in str(info.value)
    assert fault in str(info.value)


def test_a_missing_models_dir_is_refused_by_name(tmp_path: Path) -> None:
    with pytest.raises(SpecError, match="does not exist"):
        scan_models_dir(tmp_path / "absent")


def test_the_catalog_joins_specs_and_directories_and_refuses_a_name_twice(
    tmp_path: Path,
) -> None:
    root = _models_dir(tmp_path)
    catalog = build_catalog(["echo"], [(root, scan_models_dir)])
    assert sorted(catalog) == ["echo", "mine", "say", "tiny"]
    assert catalog["echo"].origin == "--model"

    with pytest.raises(SpecError, match="'say' is named twice: by --model and by "):
        build_catalog(["say=echo"], [(root, scan_models_dir)])


def test_another_directory_source_plugs_in_beside_the_models_dir(tmp_path: Path) -> None:
    # The seam a cache of pulled models uses: any function from a directory to entries.
    cache = tmp_path / "cache"
    cache.mkdir()

    def cached(path: Path) -> list[CatalogEntry]:
        return entries_from_specs([f"{p.name}=echo" for p in sorted(path.iterdir())])

    (cache / "pulled").mkdir()
    catalog = build_catalog([], [(_models_dir(tmp_path), scan_models_dir), (cache, cached)])
    assert "pulled" in catalog and catalog["pulled"].ref.load_class() is EchoModel


def test_a_model_toml_source_is_kept_for_the_first_load_with_its_pin(tmp_path: Path) -> None:
    folder = tmp_path / "chat"
    folder.mkdir()
    pin = "ab" * 32
    (folder / "model.toml").write_text(
        f'source = "hf:org/repo:m.gguf"\nsha256 = "{pin}"\n[options]\nn_ctx = 512\n'
    )
    (entry,) = scan_models_dir(tmp_path)
    assert entry.source == f"hf:org/repo:m.gguf?sha256={pin}"
    assert entry.ref.target.endswith("LlamaCppModel") and entry.ref.options["n_ctx"] == 512


@pytest.mark.parametrize(
    ("text", "fault"),
    [
        ('source = "hf:org/repo"\nspec = "echo"\n', "not both"),
        ('source = "/etc/passwd"\n', "unknown pull source"),
        ('source = "hf:org/repo"\nsha256 = "12"\n', "64 hex digits"),
        ('spec = "echo"\nsha256 = "' + "a" * 64 + '"\n', "there is none"),
    ],
)
def test_a_bad_model_toml_source_is_refused_naming_the_file(
    tmp_path: Path, text: str, fault: str
) -> None:
    folder = tmp_path / "chat"
    folder.mkdir()
    (folder / "model.toml").write_text(text)
    with pytest.raises(SpecError, match=fault) as caught:
        scan_models_dir(tmp_path)
    assert "model.toml" in str(caught.value)
