"""The edge from the command line: keys from flags, a file and the environment; the
captured output of a real server process never shows a key; configuration errors name
the key at fault and never the secret."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import httpx
import pytest

from tests.support import ROOT, scaled, serve_argv
from zeroserve.config import ConfigError, load_config

FLAG_KEY = "sk-flag-aaaaaaaaaaaa1"
ENV_KEY = "sk-env-bbbbbbbbbbbbb2"
FILE_KEY = "sk-file-cccccccccccc3"
WRONG_KEY = "sk-wrong-dddddddddddd4"


def test_keys_never_appear_in_the_server_output(tmp_path: Path) -> None:
    keys = tmp_path / "keys.toml"
    keys.write_text(f'[keys.carol]\nkey = "{FILE_KEY}"\nrequests_per_minute = 1\n')
    env = dict(
        os.environ,
        ZEROSERVE_API_KEY=ENV_KEY,
        PYTHONUNBUFFERED="1",
        PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
    )
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "zeroserve",
            "serve",
            "--host",
            "127.0.0.1",
            "--port",
            "0",
            "--model",
            "echo",
            "--log-level",
            "debug",
            "--access-log",
            "-",
            "--api-keys-file",
            str(keys),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        env=env,
        cwd=ROOT,
    )
    captured: list[bytes] = []
    reader = threading.Thread(target=_capture, args=(proc, captured), daemon=True)
    try:
        url = _wait_for_url(proc, captured)
        reader.start()
        ok = httpx.post(url + "/v1/raw/echo", content=b"hi", headers={"x-api-key": ENV_KEY})
        assert ok.status_code == 200
        assert httpx.get(url + "/v1/models", headers={"api-key": FILE_KEY}).status_code == 200
        limited = httpx.get(url + "/v1/models", headers={"api-key": FILE_KEY})
        assert limited.status_code == 429 and FILE_KEY not in limited.text
        for bad in (WRONG_KEY, f"Bearer {WRONG_KEY}", f"Bearer {FILE_KEY}x"):
            r = httpx.get(url + "/v1/models", headers={"authorization": bad})
            assert r.status_code == 401 and WRONG_KEY not in r.text
        r = httpx.get(url + f"/v1/models?api_key={WRONG_KEY}")
        assert r.status_code == 401 and WRONG_KEY not in r.text
        metrics = httpx.get(url + "/metrics").text
        assert 'zeroserve_api_key_rejected_requests_total{key="carol"} 1.0' in metrics
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(scaled(30)) == 0
    reader.join(scaled(30))
    assert proc.stdout is not None
    proc.stdout.close()
    text = b"".join(captured)
    for secret in (ENV_KEY, FILE_KEY, WRONG_KEY, FLAG_KEY):
        assert secret.encode() not in text
        assert secret.encode() not in metrics.encode()
    records = [json.loads(x) for x in text.splitlines() if x.startswith(b"{")]
    assert {r.get("key") for r in records} >= {"default", "carol", None}
    assert sum(1 for r in records if r["status"] == 401) == 4
    assert all("?" not in r["path"] for r in records)


def _wait_for_url(proc: subprocess.Popen[bytes], captured: list[bytes]) -> str:
    """Read the output until the server says where it listens (it exits on failure, so
    the read ends either way; pytest's timeout bounds a hang)."""
    assert proc.stdout is not None
    for line in iter(proc.stdout.readline, b""):
        captured.append(line)
        if b" serving [" in line:
            return "http://" + line.rsplit(b"http://", 1)[1].strip().decode()
    raise AssertionError("server did not start:\n" + b"".join(captured).decode())


def _capture(proc: subprocess.Popen[bytes], captured: list[bytes]) -> None:
    assert proc.stdout is not None
    captured.extend(iter(proc.stdout.readline, b""))


def test_edge_configuration_layers_and_errors(tmp_path: Path) -> None:
    cfg = load_config(
        env={
            "ZEROSERVE_API_KEY": ENV_KEY,
            "ZEROSERVE_EDGE__CORS_ORIGINS": "https://a.example,https://b.example",
        },
    )
    opts = cfg.edge.options()
    assert [k.name for k in opts.keys] == ["default"]
    assert opts.cors_origins == ("https://a.example", "https://b.example")
    cfg = load_config(
        env={"ZEROSERVE_API_KEY": ENV_KEY},
        overrides={"edge": {"api_keys": [FLAG_KEY, "sk-second"]}},
    )
    assert [k.name for k in cfg.edge.options().keys] == ["key-1", "key-2"]  # flags win
    with pytest.raises(ConfigError, match="credentials") as info:
        load_config(
            env={}, overrides={"edge": {"cors_origins": ["*"], "cors_allow_credentials": True}}
        ).edge.options()
    assert "edge" in info.value.message
    bad = tmp_path / "keys.toml"
    bad.write_text(f'[keys.x]\nkey = "{FILE_KEY}"\nmax_concurrent = -1\n')
    with pytest.raises(ConfigError) as info:
        load_config(env={}, overrides={"edge": {"api_keys_file": str(bad)}}).edge.options()
    assert "[keys.x]" in info.value.message and FILE_KEY not in info.value.message
    # A key no header can carry as sent (a space in it) fails at startup, named, not shown.
    with pytest.raises(ConfigError, match="visible ASCII") as info:
        load_config(env={}, overrides={"edge": {"api_keys": ["sk-has space"]}}).edge.options()
    assert "'default'" in info.value.message and "sk-has" not in info.value.message
    with pytest.raises(ConfigError, match=r"tls\.certfile"):
        load_config(env={}, overrides={"tls": {"keyfile": "k.pem"}}).server_options()
    tls = load_config(env={}, overrides={"tls": {"certfile": "c.pem"}}).server_options().tls
    assert tls is not None and tls.certfile == "c.pem"


def test_a_bad_certificate_fails_at_startup_naming_the_file(tmp_path: Path) -> None:
    cert = tmp_path / "cert.pem"
    cert.write_text("not a certificate")
    result = subprocess.run(
        serve_argv("--model", "echo", "--ssl-certfile", str(cert)),
        capture_output=True,
        text=True,
        timeout=scaled(60),
        cwd=ROOT,
    )
    assert result.returncode == 2
    assert str(cert) in result.stderr and "Traceback" not in result.stderr


def test_zeroserve_models_never_shows_a_key(tmp_path: Path) -> None:
    keys = tmp_path / "keys.toml"
    keys.write_text(f'[keys.carol]\nkey = "{FILE_KEY}"\n')
    config = tmp_path / "zeroserve.toml"
    config.write_text(f'[edge]\napi_keys = ["{FLAG_KEY}"]\napi_keys_file = "{keys}"\n')
    env = dict(
        os.environ,
        ZEROSERVE_API_KEY=ENV_KEY,
        PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
    )
    out = subprocess.run(
        [sys.executable, "-m", "zeroserve", "models", "--model", "echo", "--config", str(config)],
        capture_output=True,
        env=env,
        cwd=ROOT,
        timeout=scaled(120),
        check=False,
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith(b"echo ")
    for secret in (ENV_KEY, FILE_KEY, FLAG_KEY):
        assert secret.encode() not in out.stdout + out.stderr
