"""The latency probe processes, the /health probe (``suites/_health.py``) and the
first-event probe (``probe.py``): each probes a real HTTP server from a process of its
own, says at which priority it ran, and the sections print that sentence. No timing
assertions: only that answers were counted and the words are the probe's own."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from tests.support import scaled

from benchmarks.machine import is_realtime
from benchmarks.probe import NOT_RAISED
from benchmarks.procs import child_env
from benchmarks.report import first_event_note, probe_note
from benchmarks.runner import Grid, RunResult
from benchmarks.suites._health import PROBE_SLACK_S, HealthProbe, floor_lines

# Long enough for a few probes at one per 5 ms, short enough for a unit test.
WINDOW_S = 0.2


# The first-event probe process must answer within this (it probes for WINDOW_S).
FIRST_EVENT_TIMEOUT_S = scaled(60)
REALTIME_WORDS = ("real-time (SCHED_FIFO", "normal priority (real-time")


class _Health(BaseHTTPRequestHandler):
    """``GET /health``: 200 ``ok``; ``POST`` anything: one SSE event, then the end."""

    protocol_version = "HTTP/1.1"  # keep-alive, as the /health probe expects

    def do_GET(self) -> None:
        body = b"ok" if self.path == "/health" else b"no"
        self.send_response(200 if self.path == "/health" else 404)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length", "0")))
        body = b"data: hello\n\n"
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:  # quiet: no stderr lines
        pass


@pytest.fixture
def health_port() -> Iterator[int]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Health)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server.server_address[1]
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


@pytest.mark.parametrize("realtime", [True, False])
def test_the_probe_process_measures_a_server_and_names_its_priority(
    health_port: int, realtime: bool
) -> None:
    with HealthProbe(realtime=realtime) as probe:
        got = probe.start(health_port, WINDOW_S).result(timeout=WINDOW_S + PROBE_SLACK_S)
    assert got.latencies_ms and got.failures == 0
    assert all(x > 0 for x in got.latencies_ms)
    if realtime:
        assert probe.priority.startswith(REALTIME_WORDS)
    else:
        assert probe.priority == NOT_RAISED and not is_realtime(probe.priority)


@pytest.mark.parametrize("realtime", [True, False])
def test_the_first_event_probe_measures_a_stream_and_names_its_priority(
    health_port: int, realtime: bool, tmp_path: Path
) -> None:
    body = tmp_path / "body"
    body.write_bytes(b"tokens")
    argv = [sys.executable, "-m", "benchmarks.probe", "--port", str(health_port)]
    argv += ["--path", "/v1/raw/echo", "--body-file", str(body), "--duration", str(WINDOW_S)]
    done = subprocess.run(
        [*argv, *([] if realtime else ["--no-realtime"])],
        capture_output=True,
        text=True,
        timeout=FIRST_EVENT_TIMEOUT_S,
        check=True,
        env=child_env(None),
    )
    data = json.loads(done.stdout.strip().splitlines()[-1])
    assert data["samples_ms"] and data["failures"] == 0, data
    if realtime:
        assert data["priority"].startswith(REALTIME_WORDS)
    else:
        assert data["priority"] == NOT_RAISED


def test_the_first_event_note_names_each_priority_the_grid_saw() -> None:
    grid = Grid()
    assert first_event_note(grid) == ""
    for rnd, words in enumerate(["real-time (SCHED_FIFO 1)", "real-time (SCHED_FIFO 1)", ""]):
        grid.add(RunResult(server="s", case="c", round=rnd, ok=True, probe_priority=words))
    assert first_event_note(grid) == probe_note("first-event probe", "real-time (SCHED_FIFO 1)")


def test_each_section_says_the_probe_priority_and_why() -> None:
    fifo = probe_note("probe", "real-time (SCHED_FIFO 1)")
    assert "SCHED_FIFO 1" in fifo and "time slice" in fifo
    refused = probe_note("first-event probe", "normal priority (real-time refused: EPERM)")
    assert refused.startswith("The first-event probe ran at normal priority (real-time refused")
    assert "time slice" in refused
    floor = {"idle": [0.2], "server CPU busy": [1.0], "both CPUs busy": [2.0]}
    (text,) = [line for line in floor_lines(floor, {}, "real-time (SCHED_FIFO 1)") if line]
    assert fifo in text
