"""What we tell users runs: every code block of README.md and docs/*.md that a reader would
paste runs here, against real servers on 127.0.0.1.

Marks this test honours (a marked block is checked for its mark, never run):

* a language tag for text that is not a command: ``text``, ``toml``, ``yaml``, ``nginx``,
  ``json``, ``http`` (output samples, configuration excerpts);
* ``<!-- not tested: REASON -->`` as the nearest non-blank line above the block, with
  the reason (a block that needs a cluster, a certificate, another machine, or that runs
  this suite itself);
* a file the reader saves: a non-shell block whose first line is ``# NAME.EXT`` (``#
  my_model.py``, ``# keys.toml: ...``) is written into the directory every block runs
  in, before any block runs; a Python one must also import.

How the rest runs:

* ``python``: as a script, with ``http://127.0.0.1:8000`` replaced by the address of the
  server this module starts once (``zeroserve serve`` with the default models, as
  ``make serve`` serves them);
* ``sh``, ``bash``, ``shell``: each command in order (backslash continuations joined).
  ``zeroserve serve ...`` (after optional ``VAR=value`` words) starts a server, with its
  ``--host`` made 127.0.0.1 and its ``--port`` a free port, waits until ``/ready``
  answers 200, and serves the block's later commands until the next ``zeroserve serve``
  or the block's end; it must then exit cleanly. Any other command runs in ``bash -e -o
  pipefail`` with ``zeroserve`` on ``PATH``, ``127.0.0.1:8000`` replaced by the current
  server's address, and ``curl`` failing on an HTTP error status (a ``.curlrc`` with
  ``--fail-with-body``); it must exit 0.
* Placeholders a reader fills in are filled with what is installed:
  ``/path/model.gguf`` with SmolLM2's GGUF, ``/path/model.onnx`` with MiniLM's ONNX file.

A block without a language tag fails (tag it), and so does a mark without a reason.
"""

from __future__ import annotations

import os
import re
import shlex
import socket
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from tests.support import ROOT, ServerProcess, model_scaled, scaled, start_server, wait_until

DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
NOT_COMMANDS = frozenset({"text", "toml", "yaml", "nginx", "json", "http"})
SHELLS = frozenset({"sh", "bash", "shell"})
RUNNABLE = SHELLS | {"python"}
NOT_TESTED = re.compile(r"^<!-- not tested: (?P<reason>\S.*?)\s*-->$")
SAVED_FILE = re.compile(r"^# (?P<name>[A-Za-z_][\w-]*\.[A-Za-z]+)(?=$|[\s:])")
DOC_ADDRESS = "127.0.0.1:8000"
COMMAND_TIMEOUT_S = 180.0
# A block that names llama.cpp's model (the default ``smollm2``, a GGUF) waits on its niced
# decode, which a busy machine slows far more than the suite: its commands' bound is
# model_scaled, its pytest-timeout by model_slowdown (it is marked ``niced``;
# docs/decisions/0055-model-waits-scaled-for-the-niced-share.md). Every other one: scaled.
LLAMACPP_BLOCK = re.compile(r"smollm2|llamacpp:|\.gguf\b")
READY_TIMEOUT_S = 60.0
POLL_S = 0.05


@dataclass(frozen=True)
class Block:
    doc: Path
    line: int  # 1-based line of the opening fence
    language: str
    code: str
    mark: str | None  # the not-tested reason, if marked

    @property
    def name(self) -> str:
        return f"{self.doc.relative_to(ROOT)}:{self.line}"

    @property
    def niced(self) -> bool:
        return LLAMACPP_BLOCK.search(self.code) is not None

    @property
    def command_timeout(self) -> float:
        return model_scaled(COMMAND_TIMEOUT_S) if self.niced else scaled(COMMAND_TIMEOUT_S)

    @property
    def first_line(self) -> str:
        return self.code.split("\n", 1)[0]

    @property
    def saved_as(self) -> str | None:
        if self.language in SHELLS:
            return None
        m = SAVED_FILE.match(self.first_line)
        return m.group("name") if m else None


def blocks(doc: Path) -> list[Block]:
    lines = doc.read_text().split("\n")
    found: list[Block] = []
    i = 0
    while i < len(lines):
        if not lines[i].startswith("```"):
            i += 1
            continue
        language = lines[i][3:].strip()
        end = next(j for j in range(i + 1, len(lines)) if lines[j].startswith("```"))
        above = next((lines[k] for k in range(i - 1, -1, -1) if lines[k].strip()), "")
        mark = NOT_TESTED.match(above.strip())
        found.append(
            Block(
                doc,
                i + 1,
                language,
                "\n".join(lines[i + 1 : end]),
                mark.group("reason") if mark else None,
            )
        )
        i = end + 1
    return found


ALL = [b for doc in DOCS for b in blocks(doc)]
TO_RUN = [
    b
    for b in ALL
    if b.mark is None and b.language in RUNNABLE and (b.saved_as is None or b.language == "python")
]


def test_every_block_is_run_or_marked() -> None:
    assert ALL, "no code blocks found"
    for b in ALL:
        assert b.language, f"{b.name}: a block needs a language tag (```sh, ```text, ...)"
        assert b.language in RUNNABLE | NOT_COMMANDS, f"{b.name}: unknown tag {b.language!r}"
        if b.mark is not None:
            assert b.mark.strip(), f"{b.name}: a not-tested mark says why"
    # The README's first screen says what to run and shows the SDK against the default chat
    # model; these must stay.
    readme = (ROOT / "README.md").read_text()
    first_screen = "\n".join(readme.split("\n")[:40])
    for needed in ("make serve", "make test", "base_url=", "smollm2", "http://127.0.0.1:8000/"):
        assert needed in first_screen, needed


# -- the servers and the directory blocks run in ------------------------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _placeholders() -> dict[str, str]:
    from zeroserve.models.llamacpp import smollm2_path
    from zeroserve.models.minilm import onnx_path

    return {"/path/model.gguf": smollm2_path(), "/path/model.onnx": str(onnx_path())}


def _zeroserve_on_path(bin_dir: Path) -> str:
    """A directory with ``zeroserve`` in it: the console script beside this Python when
    installed (what a reader runs), else a shim running this Python's module."""
    script = Path(sys.executable).with_name("zeroserve")
    if script.exists():
        return str(script.parent)
    bin_dir.mkdir(exist_ok=True)
    shim = bin_dir / "zeroserve"
    shim.write_text(f'#!/bin/sh\nexec {shlex.quote(sys.executable)} -m zeroserve "$@"\n')
    shim.chmod(0o755)
    return str(bin_dir)


@dataclass
class Place:
    """Where blocks run: a directory holding the saved files, and the environment."""

    cwd: Path
    env: dict[str, str]


@pytest.fixture(scope="module")
def place(tmp_path_factory: pytest.TempPathFactory) -> Place:
    cwd = tmp_path_factory.mktemp("docs")
    for b in ALL:
        if b.saved_as is not None and b.mark is None:
            (cwd / b.saved_as).write_text(b.code + "\n")
    (cwd / ".curlrc").write_text("--fail-with-body\n--silent\n--show-error\n")
    env = dict(os.environ)
    env["PATH"] = os.pathsep.join([_zeroserve_on_path(cwd / "bin"), env.get("PATH", "")])
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    env["CURL_HOME"] = str(cwd)
    return Place(cwd, env)


def _wait_ready(server: ServerProcess) -> None:
    def ready() -> bool:
        assert server.proc.poll() is None, f"server exited with {server.proc.returncode}"
        try:
            return httpx.get(f"{server.url}/ready", timeout=scaled(5)).status_code == 200
        except httpx.TransportError:
            return False

    wait_until(ready, READY_TIMEOUT_S, f"{server.url}/ready to answer 200", POLL_S)


@pytest.fixture(scope="module")
def default_server(place: Place) -> Iterator[ServerProcess]:
    server = start_server(cwd=place.cwd)  # no --model: the default models, as make serve
    _wait_ready(server)
    yield server
    assert server.stop() == 0


def _start_documented(words: list[str], place: Place) -> ServerProcess:
    """``[VAR=value ...] zeroserve serve ARGS`` as the reader runs it, on 127.0.0.1 and a
    free port."""
    env = {}
    while words and re.match(r"^[A-Z_][A-Z0-9_]*=", words[0]):
        key, _, value = words.pop(0).partition("=")
        env[key] = value
    assert words[:2] == ["zeroserve", "serve"], words
    args: list[str] = []
    rest = iter(words[2:])
    for word in rest:
        if word in ("--host", "--port"):
            next(rest)
        elif not word.startswith(("--host=", "--port=")):
            args.append(word)
    server = start_server(
        *args, "--host", "127.0.0.1", "--port", str(_free_port()), env=env, cwd=place.cwd
    )
    _wait_ready(server)
    return server


def _commands(code: str) -> list[str]:
    joined = re.sub(r"\\\n\s*", " ", code)
    return [c for c in joined.split("\n") if c.strip() and not c.lstrip().startswith("#")]


def _fill(text: str, server: ServerProcess) -> str:
    text = text.replace(f"http://{DOC_ADDRESS}", server.url).replace(
        DOC_ADDRESS, f"{server.host}:{server.port}"
    )
    for placeholder, real in _placeholders().items():
        text = text.replace(placeholder, real)
    return text


def _run(argv: list[str], place: Place, what: str, timeout: float) -> None:
    proc = subprocess.run(
        argv,
        cwd=place.cwd,
        env=place.env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert proc.returncode == 0, (
        f"{what}\nexit {proc.returncode}\n--- stdout\n{proc.stdout[-3000:]}"
        f"\n--- stderr\n{proc.stderr[-3000:]}"
    )


@pytest.mark.parametrize(
    "block",
    [pytest.param(b, id=b.name, marks=[pytest.mark.niced] if b.niced else []) for b in TO_RUN],
)
def test_block_runs(block: Block, place: Place, default_server: ServerProcess) -> None:
    timeout = block.command_timeout
    if block.language == "python":
        if block.saved_as is not None:
            module = Path(block.saved_as).stem
            _run([sys.executable, "-c", f"import {module}"], place, block.name, timeout)
        else:
            code = _fill(block.code, default_server)
            _run([sys.executable, "-c", code], place, block.name, timeout)
        return
    server = default_server
    started: ServerProcess | None = None
    try:
        for command in _commands(block.code):
            words = shlex.split(_fill(command, server), comments=True)
            if "serve" in words and words[words.index("serve") - 1] == "zeroserve":
                if started is not None:
                    assert started.stop() == 0, f"{block.name}: the server before {command!r}"
                started = None
                started = server = _start_documented(words, place)
                continue
            _run(
                ["bash", "-e", "-o", "pipefail", "-c", _fill(command, server)],
                place,
                command,
                timeout,
            )
    finally:
        if started is not None:
            assert started.stop() == 0, f"{block.name}: the server did not exit cleanly"
