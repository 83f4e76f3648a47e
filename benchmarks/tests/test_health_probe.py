"""The /health probe process (``suites/_health.py``): it probes a real HTTP server from a
spawned process, says at which priority it ran, and the sections print that sentence.
No timing assertions: only that answers were counted and the words are the kernel's."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from benchmarks.machine import is_realtime
from benchmarks.report import probe_note
from benchmarks.suites._health import NOT_RAISED, PROBE_SLACK_S, HealthProbe, floor_lines

# Long enough for a few probes at one per 5 ms, short enough for a unit test.
WINDOW_S = 0.2


class _Health(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, as the probe expects

    def do_GET(self) -> None:
        body = b"ok" if self.path == "/health" else b"no"
        self.send_response(200 if self.path == "/health" else 404)
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
        assert probe.priority.startswith(("real-time (SCHED_FIFO", "normal priority (real-time"))
    else:
        assert probe.priority == NOT_RAISED and not is_realtime(probe.priority)


def test_each_section_says_the_probe_priority_and_why() -> None:
    fifo = probe_note("probe", "real-time (SCHED_FIFO 1)")
    assert "SCHED_FIFO 1" in fifo and "time slice" in fifo
    refused = probe_note("first-event probe", "normal priority (real-time refused: EPERM)")
    assert refused.startswith("The first-event probe ran at normal priority (real-time refused")
    assert "time slice" in refused
    floor = {"idle": [0.2], "server CPU busy": [1.0], "both CPUs busy": [2.0]}
    (text,) = [line for line in floor_lines(floor, {}, "real-time (SCHED_FIFO 1)") if line]
    assert fifo in text
