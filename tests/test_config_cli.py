"""Configuration layering and the command line."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from tests.support import ROOT, scaled, serve_argv, start_server
from zeroserve.cli import build_parser, model_specs
from zeroserve.config import load_config
from zeroserve.errors import ConfigError, ConfigWarning, SpecError
from zeroserve.models.loader import parse_spec
from zeroserve.runtime import RuntimeOptions


def test_layers_override_in_order(tmp_path: Path) -> None:
    toml = tmp_path / "z.toml"
    toml.write_text(
        'port = 9001\nhost = "127.0.0.2"\n[limits]\nmax_body_bytes = 10\n[timeouts]\nhead = 3.5\n'
    )
    cfg = load_config(
        str(toml),
        env={"ZEROSERVE_PORT": "9002", "ZEROSERVE_TIMEOUTS__HEAD": "4"},
        overrides={"port": 9003, "host": None},
    )
    assert cfg.port == 9003  # flag beats env beats file
    assert cfg.host == "127.0.0.2"  # file beats default; a flag left unset changes nothing
    assert cfg.limits.max_body_bytes == 10
    assert cfg.timeouts.head == 4.0  # env beats file
    assert cfg.server_options().http.max_body_bytes == 10


@pytest.mark.parametrize(
    ("env", "key"),
    [
        ({"ZEROSERVE_PORT": "eighty"}, "port"),
        ({"ZEROSERVE_LIMITS__MAX_BODY_BYTES": "lots"}, "limits.max_body_bytes"),
        ({"ZEROSERVE_LOOP": "trio"}, "loop"),
        ({"ZEROSERVE_RUNTIME__QUEUE_DEPTH": "deep"}, "runtime.queue_depth"),
    ],
)
def test_errors_name_the_key(env: dict[str, str], key: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_config(env=env)
    assert key in info.value.message


def test_unknown_environment_variables_are_named_in_a_warning_not_refused() -> None:
    # The environment is shared with other programs (ZEROSERVE_BIN of a launcher script).
    env = {
        "ZEROSERVE_BIN": "x",
        "ZEROSERVE_LIMITS__NOPE": "1",
        "ZEROSERVE_PORT__X": "2",
        "ZEROSERVE_PORT": "9004",
        "ZEROSERVE_INTERNAL_CHILD": "1",
    }
    with pytest.warns(ConfigWarning) as caught:
        cfg = load_config(env=env)
    assert len(caught) == 1
    message = str(caught[0].message)
    for name in ("ZEROSERVE_BIN", "ZEROSERVE_LIMITS__NOPE", "ZEROSERVE_PORT__X"):
        assert name in message
    assert "ZEROSERVE_INTERNAL_CHILD" not in message and "ZEROSERVE_PORT," not in message
    assert cfg.port == 9004  # the known ones still apply


def test_unknown_environment_variable_does_not_stop_the_cli() -> None:
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT / "src"), "ZEROSERVE_BIN": "x"}
    proc = subprocess.run(
        [sys.executable, "-m", "zeroserve", "models", "--model", "echo"],
        capture_output=True,
        text=True,
        timeout=scaled(60),
        cwd=ROOT,
        env=env,
    )
    assert proc.returncode == 0, proc.stderr
    assert "zeroserve: warning:" in proc.stderr and "ZEROSERVE_BIN" in proc.stderr
    assert proc.stdout.split()[0] == "echo"


def test_runtime_section_reaches_the_runtime_options(tmp_path: Path) -> None:
    toml = tmp_path / "z.toml"
    toml.write_text("[runtime]\nqueue_depth = 3\ndefault_deadline_s = 7.5\nchannel_capacity = 9\n")
    cfg = load_config(str(toml), env={"ZEROSERVE_RUNTIME__CHANNEL_CAPACITY": "5"})
    opts = cfg.runtime_options()
    assert isinstance(opts, RuntimeOptions)
    assert (opts.queue_depth, opts.default_deadline_s, opts.channel_capacity) == (3, 7.5, 5)
    assert opts.load_timeout_s == RuntimeOptions().load_timeout_s  # unset keys keep defaults
    flagged = load_config(str(toml), env={}, overrides={"runtime": {"queue_depth": 2}})
    assert flagged.runtime_options().queue_depth == 2 and flagged.runtime.default_deadline_s == 7.5


def _queue_depth(url: str, model: str) -> float:
    for line in httpx.get(url + "/metrics").text.splitlines():
        if line.startswith(f'zeroserve_queue_depth{{name="{model}"}}'):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError("no zeroserve_queue_depth for " + model)


def test_runtime_options_reach_the_served_engine(tmp_path: Path) -> None:
    toml = tmp_path / "z.toml"
    toml.write_text("[runtime]\nqueue_depth = 5\n")
    server = start_server("--config", str(toml), "--model", "echo")
    try:
        assert _queue_depth(server.url, "echo") == 5
    finally:
        assert server.stop() == 0
    server = start_server(
        "--model", "echo", "--queue-depth", "4", env={"ZEROSERVE_RUNTIME__QUEUE_DEPTH": "6"}
    )
    try:
        assert _queue_depth(server.url, "echo") == 4  # the flag beats the environment
    finally:
        assert server.stop() == 0


def test_bad_toml_is_reported(tmp_path: Path) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text("port = = 1")
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_config(str(bad), env={})


def test_model_specs() -> None:
    assert parse_spec("echo").target.endswith(":EchoModel")
    spec = parse_spec("mine=tests.support.models.raw:Reverse?executor=process&workers=2&size=3")
    assert (spec.name, spec.runtime, spec.options) == (
        "mine",
        {"executor": "process", "workers": 2},
        {"size": 3},
    )
    onnx = parse_spec("clf=onnx:/tmp/m.onnx")
    assert onnx.options["location"] == "/tmp/m.onnx"
    with pytest.raises(SpecError):
        parse_spec("not a spec")
    with pytest.raises(SpecError):
        parse_spec("onnx:/tmp/m.onnx")  # a backend needs a name
    cfg = load_config(env={}, overrides={"models": ["echo", "echo"]})
    with pytest.raises(ConfigError, match="unique"):
        model_specs(cfg)


def test_help_lists_the_options() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "zeroserve", "serve", "--help"],
        capture_output=True,
        text=True,
        check=True,
        cwd=ROOT,
    ).stdout
    for flag in (
        "--host",
        "--port",
        "--model",
        "--workers",
        "--config",
        "--loop",
        "--max-body-bytes",
    ):
        assert flag in out
    assert {"serve", "models", "bench"} <= set(build_parser()._subparsers._group_actions[0].choices)  # type: ignore[union-attr]


def test_models_command_lists_capabilities() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "zeroserve", "models", "--model", "echo"],
        capture_output=True,
        text=True,
        check=True,
        cwd=ROOT,
    ).stdout
    assert out.split()[0] == "echo" and "generate" in out and "infer" in out


def test_unknown_model_class_fails_fast_with_a_message() -> None:
    proc = subprocess.run(
        serve_argv("--model", "x=no_such_module:Model"),
        capture_output=True,
        text=True,
        timeout=scaled(60),
        cwd=ROOT,
    )
    assert proc.returncode == 2 and "no_such_module" in proc.stderr


def test_failing_load_fails_fast_with_a_message() -> None:
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "zeroserve",
            "serve",
            "--port",
            "0",
            "--model",
            "bad=tests.support.models.raw:FailsToLoad",
        ],
        capture_output=True,
        text=True,
        timeout=scaled(60),
        cwd=ROOT,
        env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"},
    )
    assert proc.returncode != 0
    assert "weights missing" in proc.stderr + proc.stdout


def test_user_model_from_a_file_on_each_executor(tmp_path: Path) -> None:
    server = start_server(
        "--model",
        "rev=tests.support.models.raw:Reverse",
        "--model",
        "revt=tests.support.models.raw:Reverse?executor=thread",
        "--model",
        "revp=tests.support.models.raw:Reverse?executor=process",
    )
    try:
        for name in ("rev", "revt", "revp"):
            r = httpx.post(f"{server.url}/v1/raw/{name}", content=b"abcdef")
            assert r.status_code == 200 and r.content == b"fedcba", name
    finally:
        assert server.stop() == 0


def test_workers_share_the_port() -> None:
    import selectors
    import socket
    import time

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "zeroserve",
            "serve",
            "--port",
            str(port),
            "--workers",
            "2",
            "--model",
            "echo",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        cwd=ROOT,
    )
    try:
        assert proc.stdout is not None
        pids: set[str] = set()
        lines: list[str] = []
        # Raw reads of the pipe, split here: the workers' ready lines can arrive in one read,
        # and a buffered readline() would keep the second one where select() cannot see it.
        fd = proc.stdout.fileno()
        pending = b""
        sel = selectors.DefaultSelector()
        sel.register(fd, selectors.EVENT_READ)
        deadline = time.monotonic() + scaled(60)
        while len(pids) < 2 and time.monotonic() < deadline:
            if not sel.select(timeout=max(0.0, deadline - time.monotonic())):
                break
            chunk = os.read(fd, 65536)
            if not chunk:
                break
            pending += chunk
            *done, pending = pending.split(b"\n")
            for raw in done:
                line = raw.decode(errors="replace") + "\n"
                lines.append(line)
                if "serving" in line:
                    pids.add(line.split()[1])
        sel.close()
        assert len(pids) == 2, "two workers should serve:\n" + "".join(lines)
        with httpx.Client() as client:
            for _ in range(10):
                assert (
                    client.post(f"http://127.0.0.1:{port}/v1/raw/echo", content=b"hi").content
                    == b"hi"
                )
    finally:
        proc.terminate()
        assert proc.wait(timeout=scaled(30)) == 0
        assert proc.stdout is not None
        proc.stdout.close()
