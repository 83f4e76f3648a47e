"""The API suites (``benchmarks/suites/w3.py``, ``w4.py``, ``tinyllm.py``, ``gateway.py``,
``llamacpp.py``): W3 end to end in --quick mode, and
the pieces of the others that need no server (validators, token counting, the stream
client against a tiny in-process SSE server). No timing assertions.
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import re
import shutil
from pathlib import Path

import pytest


def _importable(mod: str) -> bool:
    try:
        return importlib.util.find_spec(mod) is not None
    except (ImportError, ValueError):
        return False


def test_w4_validators_accept_an_identity_answer() -> None:
    from benchmarks.suites import w4

    binary, js = w4.w4_cases()
    n = int(binary.headers["Inference-Header-Content-Length"])
    header, raw = binary.body[:n], binary.body[n:]
    assert len(raw) == 4 * 1024 * 1024
    answer = json.dumps(
        {
            "outputs": [
                {
                    "name": "INPUT0",
                    "datatype": "FP32",
                    "shape": [w4.W4_ELEMENTS],
                    "parameters": {"binary_data_size": len(raw)},
                }
            ]
        }
    ).encode()
    ok = binary.validate(200, {"inference-header-content-length": str(len(answer))}, answer + raw)
    assert ok is None
    assert (
        binary.validate(
            200,
            {"inference-header-content-length": str(len(answer))},
            answer + raw[:-4] + b"\0\0\0\0",
        )
        is not None
    )
    assert js.validate(500, {}, b"") is not None
    assert json.loads(header)["inputs"][0]["parameters"]["binary_data_size"] == len(raw)


def test_token_counting_and_chat_validator() -> None:
    from benchmarks.scenarios import chat_validator
    from benchmarks.streamclient import count_tokens

    assert count_tokens(b'{"choices":[{"delta":{"content":"x"}}]}') == 1
    assert count_tokens(b'{"choices":[{"delta":{"role":"assistant","content":""}}]}') == 0
    assert count_tokens(b"[DONE]") == 0
    # Anthropic's Messages events: a text delta is a token, the rest are not.
    delta = b'{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"x"}}'
    assert count_tokens(delta) == 1
    assert count_tokens(delta.replace(b'"x"', b'""')) == 0
    args = b'{"type":"content_block_delta","index":0,"delta":{"type":"input_json_delta","partial_json":"{"}}'
    assert count_tokens(args) == 0
    assert count_tokens(b'{"type":"ping"}') == 0
    assert count_tokens(b'{"type":"message_stop"}') == 0
    check = chat_validator(2)
    good = {"object": "chat.completion", "choices": [{"message": {"content": "a b"}}]}
    assert check(200, {}, json.dumps(good).encode()) is None
    assert check(200, {}, b"{}") is not None


def test_stream_client_counts_tokens_and_first_token(tmp_path: Path) -> None:
    """The asyncio client against a minimal chunked SSE server on 127.0.0.1."""
    from benchmarks import streamclient

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        length = int(re.search(rb"content-length: (\d+)", head.lower()).group(1))  # type: ignore[union-attr]
        await reader.readexactly(length)
        writer.write(
            b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
            b"transfer-encoding: chunked\r\n\r\n"
        )
        events = [b'data: {"choices":[{"delta":{"role":"assistant","content":""}}]}\n\n']
        events += [b'data: {"choices":[{"delta":{"content":"t%d"}}]}\n\n' % i for i in range(5)]
        events.append(b"data: [DONE]\n\n")
        data = b"".join(events)
        for i in range(0, len(data), 7):  # chunks that split events anywhere
            piece = data[i : i + 7]
            writer.write(b"%x\r\n%s\r\n" % (len(piece), piece))
        writer.write(b"0\r\n\r\n")
        await writer.drain()
        writer.close()

    async def run() -> streamclient.StreamStats:
        server = await asyncio.start_server(serve, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        async with server:
            return await streamclient.stream_load(port, "/v1/chat/completions", b"{}", 2, 0.3)

    stats = asyncio.run(run())
    assert stats.failures == 0, stats.errors
    assert stats.streams > 0
    # Tokens are counted inside the window, streams when they complete: the (at most 2)
    # streams still running when the window closes add some tokens but no stream.
    assert 5 * stats.streams <= stats.tokens <= 5 * (stats.streams + 2)
    assert len(stats.ttft_ms) >= stats.streams
    # 5 content chunks a stream: 4 gaps after its first (none for the role chunk)
    assert len(stats.itl_ms) >= 4 * stats.streams
    assert len(stats.itl_ms) <= 4 * len(stats.ttft_ms)


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.skipif(shutil.which("wrk") is None, reason="wrk not installed (make bench-tools)")
@pytest.mark.skipif(
    not _importable("fastapi") or not _importable("uvicorn"),
    reason="bench extra (fastapi, uvicorn) not installed",
)
def test_w3_quick_section_has_numbers(tmp_path: Path) -> None:
    from benchmarks.context import SuiteContext
    from benchmarks.machine import Pinning
    from benchmarks.suites import _api, w3

    ctx = SuiteContext(quick=True, results_dir=tmp_path, pins=Pinning(None, None), command="test")
    section = w3.w3(ctx)
    assert section.group == _api.GROUP
    text = section.markdown
    assert text.startswith("### W3")
    for title in ("zeroserve", "FastAPI+pydantic"):
        row = next(
            line
            for line in text.splitlines()
            if line.startswith("| 64 KB prompt x") and f"| {title} |" in line
        )
        cells = [c.strip() for c in row.strip("|").split("|")]
        assert float(cells[2].replace(",", "")) > 0, row  # req/s
        assert float(cells[5].replace(",", "")) > 0, row  # p99 ms
    assert re.search(r"\| W3 req/s \| .* \| [\d.]+x ", text), text


def test_llamacpp_batching_paragraph_reasons_from_the_runs_own_rate() -> None:
    """The arithmetic and bandwidth the paragraph quotes follow this run's one-stream rate
    (it quoted a fixed 65 tokens/s whatever the run measured)."""
    from benchmarks.suites.llamacpp import _batching

    rates = {
        (1, "zeroserve"): [40.0],
        (8, "zeroserve"): [60.0],
        (32, "zeroserve"): [62.0],
        (1, "llama.cpp"): [41.0],
        (8, "llama.cpp"): [59.0],
    }
    text = _batching(lambda conc, name: rates.get((conc, name), []))
    assert "8 streams give 1.50x the tokens/s of one stream" in text
    assert "this run's 40 tokens/s of one stream is ~10.8 GFLOP/s" in text
    assert "stream at ~3.6 GB/s" in text
    assert "65 tokens/s" not in text


def test_llamacpp_keeps_every_rounds_samples_as_json() -> None:
    """The suite's raw file holds each round's own samples, keyed by streams, server and
    round, and survives a JSON round trip with every figure the section computes from."""
    from benchmarks.streamclient import StreamStats
    from benchmarks.suites.llamacpp import rounds_json

    first = StreamStats(tokens=300, streams=9, ttft_ms=[20.0, 25.5], itl_ms=[12.0], duration_s=5.0)
    second = StreamStats(tokens=280, streams=8, failures=1, ttft_ms=[30.0], duration_s=5.0)
    peer = StreamStats(tokens=310, streams=9, ttft_ms=[19.0], duration_s=5.0)
    res = {
        (8, "zeroserve"): [(first, [0.5, 0.7], 4.5), (second, [0.9], 4.4)],
        (8, "llama.cpp"): [(peer, [0.6], 4.6)],
    }
    data = json.loads(json.dumps(rounds_json(res, {"idle": [0.3, 0.4]})))
    ours = [r for r in data["rounds"] if r["server"] == "zeroserve"]
    assert [r["round"] for r in ours] == [0, 1]
    assert ours[1]["tokens"] == 280 and ours[1]["failures"] == 1
    assert ours[0]["ttft_ms"] == [20.0, 25.5] and ours[0]["health_ms"] == [0.5, 0.7]
    assert ours[0]["inter_token_ms"] == [12.0] and ours[0]["server_cpu_s"] == 4.5
    assert data["floor_ms"] == {"idle": [0.3, 0.4]}
    assert {r["streams"] for r in data["rounds"]} == {8}
