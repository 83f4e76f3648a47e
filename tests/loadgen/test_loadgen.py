"""``zeroserve bench URL``, the load generator, run as a subprocess against real servers:
zeroserve serving echo (OpenAI chat and completions, streamed and not, V2, raw), the
FastAPI peer of the benchmark harness (another OpenAI-compatible server), and a stdlib
server answering 429 and 500. Counts are exact (echo streams exactly ``max_tokens``
tokens); no timing is asserted.
"""

from __future__ import annotations

import importlib.util
import json
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from tests.support import ROOT, ServerProcess, scaled, start_server

# One bench run (a few dozen requests on loopback) must end well within this.
RUN_TIMEOUT_S = scaled(60.0)
PEER_START_TIMEOUT_S = scaled(30.0)


@pytest.fixture(scope="module")
def echo() -> Iterator[ServerProcess]:
    server = start_server("--model", "echo")
    yield server
    assert server.stop() == 0


def bench(url: str, *args: str, json_out: bool = True) -> tuple[int, Any, str]:
    """Run ``zeroserve bench`` as a subprocess: (exit status, stdout (parsed when --json),
    stderr)."""
    cmd = [sys.executable, "-m", "zeroserve", "bench", url, *args]
    if json_out:
        cmd.append("--json")
    proc = subprocess.run(
        cmd,
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT_S,
        cwd=ROOT,
        env={
            **os.environ,
            "PYTHONPATH": os.pathsep.join(
                [str(ROOT / "src"), str(ROOT), os.environ.get("PYTHONPATH", "")]
            ),
        },
    )
    out: Any = proc.stdout
    if json_out and proc.stdout.strip():
        out = json.loads(proc.stdout)
    return proc.returncode, out, proc.stderr


def _all_ok(report: dict[str, Any], n: int) -> None:
    assert report["requests"] == {"sent": n, "ok": n, "errors": 0}, report
    assert report["errors"] == {}
    assert report["latency_ms"]["n"] == n
    assert report["requests_per_s"] > 0


@pytest.mark.parametrize("endpoint", ["openai-chat", "openai-completions"])
def test_openai_streams_count_every_token(echo: ServerProcess, endpoint: str) -> None:
    rc, report, err = bench(
        echo.url,
        "--endpoint",
        endpoint,
        "--model",
        "echo",
        "--stream",
        "-n",
        "12",
        "-c",
        "3",
        "--max-tokens",
        "7",
    )
    assert rc == 0, err
    _all_ok(report, 12)
    assert report["output_tokens"] == 12 * 7
    assert report["ttft_ms"]["n"] == 12
    assert report["itl_ms"]["n"] == 12 * 6  # gaps between a request's 7 tokens
    assert report["tokens_per_s"] > 0
    assert report["stream"] is True and report["endpoint"] == endpoint


@pytest.mark.parametrize("endpoint", ["openai-chat", "openai-completions"])
def test_openai_without_stream_counts_usage_tokens(echo: ServerProcess, endpoint: str) -> None:
    rc, report, err = bench(
        echo.url,
        "--endpoint",
        endpoint,
        "--model",
        "echo",
        "-n",
        "9",
        "-c",
        "2",
        "--max-tokens",
        "5",
    )
    assert rc == 0, err
    _all_ok(report, 9)
    assert report["output_tokens"] == 9 * 5
    assert report["ttft_ms"]["n"] == 0  # no stream, no first token to time


def test_v2_and_raw(echo: ServerProcess) -> None:
    rc, report, err = bench(echo.url, "--endpoint", "v2", "--model", "echo", "-n", "8")
    assert rc == 0, err
    _all_ok(report, 8)
    assert report["output_tokens"] == 0
    rc, report, err = bench(echo.url, "--endpoint", "raw", "--model", "echo", "-n", "8", "-c", "2")
    assert rc == 0, err
    _all_ok(report, 8)
    rc, report, err = bench(
        echo.url,
        "--endpoint",
        "raw",
        "--model",
        "echo",
        "--stream",
        "-n",
        "6",
        "--max-tokens",
        "11",
        "--prompt",
        "a b c",
    )
    assert rc == 0, err
    _all_ok(report, 6)
    assert report["output_tokens"] == 6 * 11  # one SSE event per token, cycled


def test_model_is_discovered_and_duration_bounds_the_run(echo: ServerProcess) -> None:
    rc, report, err = bench(echo.url, "--duration", "0.3", "-c", "2", "--max-tokens", "3")
    assert rc == 0, err
    assert report["model"] == "echo"  # the first (only) of GET /v1/models
    sent = report["requests"]["sent"]
    assert sent >= 1 and report["requests"]["ok"] == sent
    assert report["output_tokens"] == 3 * sent


def test_table_and_progress_bar(echo: ServerProcess) -> None:
    rc, out, err = bench(echo.url, "--stream", "-n", "5", "--max-tokens", "4", json_out=False)
    assert rc == 0, err
    assert "5 sent, 5 ok, 0 errors" in out
    assert "req/s" in out and "output tokens/s (20 tokens)" in out
    for label in ("latency", "TTFT", "inter-token", "p50", "p90", "p99"):
        assert label in out
    assert "errors          none" in out
    assert "[" + "#" * 30 + "] 5/5" in err  # the finished bar


@pytest.mark.skipif(
    importlib.util.find_spec("matplotlib") is None,
    reason="matplotlib (the bench extra) not installed",
)
def test_plot_writes_a_png(echo: ServerProcess, tmp_path: Path) -> None:
    png = tmp_path / "run.png"
    rc, _report, err = bench(echo.url, "--stream", "-n", "6", "--plot", str(png))
    assert rc == 0, err
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_plot_without_matplotlib_says_what_to_install(echo: ServerProcess, tmp_path: Path) -> None:
    code = (
        "import sys; sys.modules['matplotlib'] = None; from zeroserve.cli import main; "
        "sys.exit(main(sys.argv[1:]))"
    )
    proc = subprocess.run(
        [
            sys.executable,
            "-c",
            code,
            "bench",
            echo.url,
            "-n",
            "1",
            "--plot",
            str(tmp_path / "x.png"),
        ],
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT_S,
        cwd=ROOT,
    )
    assert proc.returncode == 2
    assert "matplotlib" in proc.stderr and "zeroserve[bench]" in proc.stderr
    assert not (tmp_path / "x.png").exists()


@pytest.mark.parametrize(
    "args",
    [
        ["-n", "0"],
        ["-c", "0"],
        ["--duration", "-1"],
        ["--endpoint", "v2", "--model", "echo", "--stream"],
    ],
)
def test_bad_arguments_are_refused(echo: ServerProcess, args: list[str]) -> None:
    rc, _out, err = bench(echo.url, *args, json_out=False)
    assert rc == 2 and "zeroserve bench: error:" in err


def test_unreachable_server_is_an_error() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # nothing listens here once closed
    rc, _out, err = bench(f"http://127.0.0.1:{port}", "-n", "1", json_out=False)
    assert rc == 2 and "cannot list the models" in err
    rc, report, err = bench(f"http://127.0.0.1:{port}", "--model", "m", "-n", "3")
    assert rc == 1
    assert report["requests"] == {"sent": 3, "ok": 0, "errors": 3}
    assert sum(report["errors"].values()) == 3 and all(
        k.startswith("connect") for k in report["errors"]
    )


class _Refusing(BaseHTTPRequestHandler):
    """Answers 429 then 500, alternately, with a JSON error body (keep-alive)."""

    protocol_version = "HTTP/1.1"
    count = 0
    lock = threading.Lock()

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length", "0")))
        with self.lock:
            type(self).count += 1
            status = 429 if self.count % 2 else 500
        body = json.dumps({"error": {"message": "no", "code": status}}).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        pass


def test_429_and_500_are_counted_by_status() -> None:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Refusing)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}"
        rc, report, _err = bench(url, "--model", "m", "-n", "10", "-c", "1")
    finally:
        server.shutdown()
        server.server_close()
        thread.join()
    assert rc == 1
    assert report["requests"] == {"sent": 10, "ok": 0, "errors": 10}
    assert report["errors"] == {"429": 5, "500": 5}
    assert report["latency_ms"]["n"] == 0  # failed requests are not in the latencies


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@pytest.fixture(scope="module")
def fastapi_peer() -> Iterator[str]:
    """The benchmark harness's FastAPI peer (uvicorn on 127.0.0.1): another
    OpenAI-compatible server."""
    if importlib.util.find_spec("fastapi") is None or importlib.util.find_spec("uvicorn") is None:
        pytest.skip("fastapi/uvicorn (the bench extra) not installed")
    port = _free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "benchmarks.peers.fastapi_app", "--port", str(port)],
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + PEER_START_TIMEOUT_S
        while True:
            assert proc.poll() is None, "the FastAPI peer exited"
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=scaled(1.0)):
                    break
            except OSError:
                assert time.monotonic() < deadline, "the FastAPI peer did not start"
                time.sleep(0.05)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=scaled(10))
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@pytest.mark.parametrize("stream", [False, True])
def test_another_openai_compatible_server(fastapi_peer: str, stream: bool) -> None:
    for endpoint in ("openai-chat", "openai-completions"):
        args = [
            "--endpoint",
            endpoint,
            "--model",
            "echo",
            "-n",
            "6",
            "-c",
            "2",
            "--max-tokens",
            "4",
        ]
        rc, report, err = bench(fastapi_peer, *args, *(["--stream"] if stream else []))
        assert rc == 0, (endpoint, err, report)
        _all_ok(report, 6)
        assert report["output_tokens"] == 6 * 4, (endpoint, report)


class _DropsIdle(BaseHTTPRequestHandler):
    """Answers 200 with Content-Length and no ``Connection: close``, then closes the
    connection anyway, as a server does when its keep-alive timeout passes."""

    protocol_version = "HTTP/1.1"

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length", "0")))
        body = b'{"usage": {"completion_tokens": 2}}'
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
        self.close_connection = True

    def log_message(self, format: str, *args: Any) -> None:
        pass


def test_a_kept_alive_connection_closed_by_the_server_is_reopened() -> None:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _DropsIdle)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}"
        rc, report, err = bench(url, "--model", "m", "-n", "6", "-c", "1")
    finally:
        server.shutdown()
        server.server_close()
        thread.join()
    assert rc == 0, (err, report)
    assert report["requests"] == {"sent": 6, "ok": 6, "errors": 0}
    assert report["output_tokens"] == 12
