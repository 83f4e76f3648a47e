"""The page at / and /v1/stats over HTTP (no browser): headers, weight, switches."""

from __future__ import annotations

import httpx

from tests.support import ServerProcess, start_server
from tests.ui.stats import counter, histogram
from zeroserve.app.endpoints.ui import FILES, MAX_PAGE_BYTES

# A key for the keyed server (passed through the environment, never on a command line).
API_KEY = "ui-test-key-0123456789"


def test_page_is_served_with_a_strict_policy(ui_server: ServerProcess) -> None:
    with httpx.Client(base_url=ui_server.url) as client:
        total = 0
        for path in FILES:
            r = client.get(path)
            assert r.status_code == 200, path
            total += len(r.content)
            csp = r.headers["content-security-policy"]
            directives = dict(d.strip().split(" ", 1) for d in csp.split(";"))
            assert directives["default-src"] == "'none'"
            assert directives["script-src"] == "'self'"
            assert directives["style-src"] == "'self'"
            assert directives["connect-src"] == "'self'"
            assert "unsafe" not in csp
            assert r.headers["x-content-type-options"] == "nosniff"
            # a revalidation costs a 304 with no body
            again = client.get(path, headers={"if-none-match": r.headers["etag"]})
            assert again.status_code == 304 and again.content == b""
        assert client.get("/").headers["content-type"].startswith("text/html")
        assert client.get("/ui/app.js").headers["content-type"].startswith("text/javascript")
        assert total <= MAX_PAGE_BYTES
        page = client.get("/").text
        # no inline code: the only script and style are the files above
        assert "<script>" not in page and "<style" not in page and " on" not in page.lower()


def test_stats_carries_the_metrics_values(ui_server: ServerProcess) -> None:
    with httpx.Client(base_url=ui_server.url) as client:
        body = b"x" * 4096
        assert client.post("/v1/raw/echo", content=body).content == body
        stats = client.get("/v1/stats")
        assert stats.status_code == 200
        assert stats.headers["content-type"] == "application/json"
        doc = stats.json()
        text = client.get("/metrics").text
    assert doc["process"] == ui_server.proc.pid
    assert doc["models"]["echo"] == ["embed", "generate", "infer"]
    assert doc["models"]["minilm"] == ["embed"]
    assert counter(doc, "zeroserve_http_requests", route="/v1/raw/{model}", status="200") >= 1
    payload_in = counter(doc, "zeroserve_payload_bytes", direction="in")
    assert payload_in >= len(body)
    queue = doc["sources"]["queue"]["echo"]
    assert queue["admitted"] >= 1 and queue["in_flight"] == 0
    lag = histogram(doc, "zeroserve_event_loop_lag_seconds")
    assert len(lag["counts"]) == len(lag["bounds"]) + 1 and sum(lag["counts"]) == lag["count"]
    # the same counters /metrics exposes (read after the stats, so at least as large)
    for line in text.splitlines():
        if line.startswith('zeroserve_payload_bytes_total{direction="in"}'):
            assert float(line.split()[-1]) >= payload_in
            break
    else:
        raise AssertionError("zeroserve_payload_bytes_total is missing from /metrics")


def test_stats_counts_the_pieces_of_a_stream(ui_server: ServerProcess) -> None:
    def generation() -> dict[str, float]:
        doc = httpx.get(f"{ui_server.url}/v1/stats").json()
        return {
            "pieces": counter(doc, "zeroserve_stream_pieces", model="echo"),
            "first": histogram(doc, "zeroserve_stream_first_piece_seconds", model="echo")["count"],
            "inter": histogram(doc, "zeroserve_stream_inter_piece_seconds", model="echo")["count"],
        }

    before = generation()
    request = {
        "model": "echo",
        "stream": True,
        "max_tokens": 5,
        "messages": [{"role": "user", "content": "one two"}],
    }
    with httpx.stream("POST", f"{ui_server.url}/v1/chat/completions", json=request) as r:
        assert r.status_code == 200
        events = [line for line in r.iter_lines() if line.startswith("data: {")]
    assert len(events) >= 5
    after = generation()
    assert after["pieces"] - before["pieces"] == 5
    assert after["first"] - before["first"] == 1
    assert after["inter"] - before["inter"] == 4


def test_no_ui_turns_the_page_off() -> None:
    for server in (
        start_server("--model", "echo", "--no-ui"),
        start_server("--model", "echo", env={"ZEROSERVE_UI": "false"}),
    ):
        try:
            with httpx.Client(base_url=server.url) as client:
                for path in FILES:
                    r = client.get(path)
                    assert r.status_code == 404, path
                    assert r.json()["error"]["type"]  # OpenAI's error shape
                assert client.get("/v1/stats").status_code == 200
        finally:
            assert server.stop() == 0


def test_with_api_keys_the_page_is_open_and_the_stats_are_not() -> None:
    server = start_server("--model", "echo", env={"ZEROSERVE_API_KEY": API_KEY})
    try:
        with httpx.Client(base_url=server.url) as client:
            for path in FILES:
                assert client.get(path).status_code == 200, path  # static, no data
            refused = client.get("/v1/stats")
            assert refused.status_code == 401
            assert refused.json()["error"]["type"]
            assert client.get("/v1/models").status_code == 401
            keyed = client.get("/v1/stats", headers={"authorization": f"Bearer {API_KEY}"})
            assert keyed.status_code == 200 and "echo" in keyed.json()["models"]
    finally:
        assert server.stop() == 0
