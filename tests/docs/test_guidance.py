"""Help that teaches: every command's ``--help`` ends with examples that parse, the
``zeroserve`` command finds a model module in the current directory as its help says, an
unknown route's 404 names the closest served route and the API document, and a 401 says
how to send a key. Error bodies never repeat what the client sent (a path, a key)."""

from __future__ import annotations

import shlex
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest

from tests.support import ROOT, ServerProcess, scaled, start_server
from zeroserve.cli import build_parser
from zeroserve.models.loader import parse_spec

KEY = "sk-guidance-test-0001"
# Sent where a path or a key goes; no error body may contain it.
CANARY = "CANARY7f3a"


@pytest.fixture(scope="module")
def keyed() -> Iterator[ServerProcess]:
    server = start_server("--model", "echo", "--api-key", KEY)
    yield server
    assert server.stop() == 0


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


def _error(resp: httpx.Response) -> str:
    body = resp.json()
    error = body["error"]
    return str(error["message"] if isinstance(error, dict) else error)


def test_an_unknown_route_names_the_closest_route_and_the_api_document(
    keyed: ServerProcess,
) -> None:
    auth = {"Authorization": f"Bearer {KEY}"}
    with httpx.Client(base_url=keyed.url, headers=auth, timeout=scaled(30)) as client:
        resp = client.post("/v1/chat/completion", json={})
        assert resp.status_code == 404
        message = _error(resp)
        assert "/v1/chat/completions" in message
        assert "GET /openapi.json" in message
        # The document it names is there and lists that route.
        assert "/v1/chat/completions" in client.get("/openapi.json").json()["paths"]

        resp = client.get(f"/v1/{CANARY}/<script>")
        assert resp.status_code == 404
        message = _error(resp)
        assert CANARY not in message and "<script>" not in message
        assert "GET /openapi.json" in message

        # KServe V2 paths answer in KServe's error shape, with the same guidance.
        resp = client.get("/v2/health/lve")
        assert resp.status_code == 404
        assert isinstance(resp.json()["error"], str)
        assert "/v2/health/live" in _error(resp)

        resp = client.delete("/v1/models")
        assert resp.status_code == 405
        assert "GET" in _error(resp) and resp.headers["allow"]


def test_a_request_without_a_key_is_told_how_to_send_one(keyed: ServerProcess) -> None:
    with httpx.Client(base_url=keyed.url, timeout=scaled(30)) as client:
        resp = client.get("/v1/models")
        assert resp.status_code == 401
        assert resp.headers["www-authenticate"].startswith("Bearer")
        message = _error(resp)
        assert "Authorization: Bearer <key>" in message and "api_key" in message

        resp = client.get("/v1/models", headers={"Authorization": f"Basic {CANARY}"})
        assert resp.status_code == 401
        message = _error(resp)
        assert "Bearer <key>" in message and CANARY not in message


def test_a_wrong_key_through_the_sdk_is_told_how_to_send_one(keyed: ServerProcess) -> None:
    client = openai.OpenAI(base_url=f"{keyed.url}/v1", api_key=f"sk-{CANARY}", max_retries=0)
    with pytest.raises(openai.AuthenticationError) as caught:
        client.models.list()
    assert caught.value.status_code == 401
    message = str(caught.value)
    assert "Authorization: Bearer <key>" in message and "api_key" in message
    assert CANARY not in message
    # The right key is accepted through the same client.
    good = openai.OpenAI(base_url=f"{keyed.url}/v1", api_key=KEY, max_retries=0)
    assert [m.id for m in good.models.list()] == ["echo"]


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
        timeout=scaled(60),
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split()[:2] == ["mine", "infer"]
