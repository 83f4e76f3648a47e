"""Help that teaches: every command's ``--help`` ends with examples that parse, and the
``zeroserve`` command finds a model module in the current directory as its help says."""

from __future__ import annotations

import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from tests.conftest import ROOT

from zeroserve.cli import build_parser
from zeroserve.models.loader import parse_spec


def _help(*command: str) -> str:
    return subprocess.run(
        [sys.executable, "-m", "zeroserve", *command, "--help"],
        capture_output=True,
        text=True,
        check=True,
        cwd=ROOT,
    ).stdout


def _examples(text: str) -> list[list[str]]:
    """The command lines under ``examples:`` in a help text (a comment after two spaces
    or more ends a line's command)."""
    lines = text.split("examples:\n", 1)[1].split("\n\n", 1)[0].splitlines()
    commands = []
    for line in lines:
        words = shlex.split(line.strip().split("    ", 1)[0])
        assert words[0] == "zeroserve", line
        commands.append(words[1:])
    return commands


@pytest.mark.parametrize("command", [(), ("serve",), ("models",), ("bench",)])
def test_each_help_ends_with_examples_that_parse(command: tuple[str, ...]) -> None:
    examples = _examples(_help(*command))
    assert examples
    if command:  # a subcommand's examples are that subcommand's
        assert {e[0] for e in examples} == {command[0]}
    for argv in examples:
        args = build_parser().parse_args(argv)  # exits (fails the test) on a bad example
        for spec in getattr(args, "models", None) or ():
            parse_spec(spec)


def test_serve_help_names_every_default_model_and_the_gguf_spec() -> None:
    text = _help("serve")
    for name in ("echo", "tinyllm", "minilm", "smollm2", "llamacpp:/path/model.gguf"):
        assert name in text


def test_the_console_script_finds_a_model_module_in_the_current_directory(
    tmp_path: Path,
) -> None:
    script = Path(sys.executable).with_name("zeroserve")
    if not script.exists():
        pytest.skip(f"no zeroserve console script beside {sys.executable}")
    (tmp_path / "my_model.py").write_text(
        "import zeroserve\n\n"
        "class MyModel(zeroserve.Model):\n"
        "    def infer(self, batch):\n"
        "        return batch\n"
    )
    proc = subprocess.run(
        [str(script), "models", "--model", "mine=my_model:MyModel"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split()[:2] == ["mine", "infer"]
