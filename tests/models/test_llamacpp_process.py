"""A llama.cpp model whose engine runs in a child process (``engine=process``,
models/llamacpp_process.py; docs/architecture.md, "The llama.cpp backend").

Real SmolLM2 in a real server process (``zeroserve serve --models-dir``), driven by the
openai SDK and httpx. The child is found by PID among the server's children
(``/proc``), so "no child left" is checked on the process table itself. A child killed
while its GGUF is away cannot be started again, so the state between its death and a
new child is held as long as the test reads it, without timing.
"""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest

from tests.support import ServerProcess, model_scaled, scaled, start_server, wait_until
from tests.support.observe import model_metric
from tests.support.smollm2 import require_llamacpp
from zeroserve.cli import main
from zeroserve.models.llamacpp import smollm2_path

require_llamacpp()

# Its children run SmolLM2 nice levels below the loop, which a busy machine slows far more
# than the suite: what waits on a child (a load, an answer, its end) is bounded by
# model_scaled, and pytest-timeout by model_slowdown
# (docs/decisions/0055-model-waits-scaled-for-the-niced-share.md).
pytestmark = pytest.mark.niced

# The longest a child's load of SmolLM2 may take on a loaded machine (a few seconds:
# a Python start, the engine's import, the load).
LOAD_WAIT_S = 60.0
CHILD_MODULE = b"zeroserve.models.llamacpp_process"
HI = [{"role": "user", "content": "Say hi"}]
# Bans SmolLM2's end tokens (<|im_end|> 2, <|endoftext|> 0): the answer runs to max_tokens.
ENDLESS = {"logit_bias": {"2": -100, "0": -100}, "temperature": 0}
# One slot's context: room for LONG_TOKENS.
N_CTX = 4096
# Tokens a stream left mid-way asks for: at SmolLM2's ~65 tokens/s on two cores, over a
# minute (more than POLL_S), so a next answer on the one slot within POLL_S means the
# abandoned one was stopped. Both are on the same niced decode: POLL_S is model_scaled.
LONG_TOKENS = 4000
POLL_S = 30.0
# Documents reranked through the child: more than one engine call's 8.
DOCS = [f"Document number {i} is about {'Paris' if i % 3 else 'bananas'}." for i in range(20)]
QUERY = "What is the capital of France?"


def _children(pid: int) -> list[int]:
    """The PIDs of ``pid``'s child processes that run a llama.cpp engine."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes()
        except OSError:
            continue
        ppid = int(stat.rpartition(")")[2].split()[1])
        if ppid == pid and CHILD_MODULE in cmdline:
            found.append(int(entry))
    return found


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]
    except OSError:
        return False
    return state != "Z"


@pytest.fixture(scope="module")
def weights(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder holding ``frail.gguf``, a link to SmolLM2 that a test takes away."""
    folder = tmp_path_factory.mktemp("weights")
    (folder / "frail.gguf").symlink_to(smollm2_path())
    return folder


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, weights: Path) -> Iterator[ServerProcess]:
    root = tmp_path_factory.mktemp("models")
    rank = 'embedding = true\npooling = "rank"\n'
    for name, gguf, more in (
        ("iso", smollm2_path(), 'engine = "process"\n'),
        ("vec", smollm2_path(), 'engine = "process"\nembedding = true\npooling = "mean"\n'),
        ("frail", str(weights / "frail.gguf"), 'engine = "process"\n'),
        ("rr", smollm2_path(), 'engine = "process"\n' + rank),
        ("rr_inline", smollm2_path(), rank),
    ):
        (root / name).mkdir()
        (root / name / "model.toml").write_text(
            f'spec = "llamacpp:{gguf}"\n[options]\nparallel = 1\nn_ctx = {N_CTX}\n{more}'
        )
    s = start_server("--models-dir", str(root), "--model", "echo")
    yield s
    assert s.stop() == 0
    assert _children(s.proc.pid) == []


def _client(server: ServerProcess) -> openai.OpenAI:
    return openai.OpenAI(
        base_url=server.url + "/v1",
        api_key="none",
        max_retries=0,
        timeout=model_scaled(LOAD_WAIT_S),
    )


def _status(server: ServerProcess, name: str) -> dict[str, object]:
    models = httpx.get(server.url + "/models", timeout=scaled(30)).json()["data"]
    status: dict[str, object] = next(m for m in models if m["id"] == name)["status"]
    return status


def _state(server: ServerProcess, name: str) -> str:
    return str(_status(server, name)["value"])


def _alive_children(server: ServerProcess) -> set[int]:
    return {p for p in _children(server.proc.pid) if _alive(p)}


def _unload(server: ServerProcess, name: str) -> None:
    """Unload ``name``: the answer waits for its engine (a child: killed and reaped)."""
    r = httpx.post(server.url + "/models/unload", json={"model": name}, timeout=model_scaled(30))
    r.raise_for_status()


def test_health_answers_while_the_child_loads(server: ServerProcess) -> None:
    loaded = threading.Event()

    def load() -> None:
        r = httpx.post(server.url + "/models/load", json={"model": "iso"}, timeout=model_scaled(60))
        r.raise_for_status()
        loaded.set()

    loader = threading.Thread(target=load)
    loader.start()
    wait_until(lambda: _state(server, "iso") == "loading", 30, "the load to start")
    answered_during_load = 0
    while not loaded.is_set() and loader.is_alive():
        r = httpx.get(server.url + "/health", timeout=scaled(5))
        assert r.status_code == 200
        # Ordering, not time: this answer came while the load's reply had not.
        if _state(server, "iso") == "loading":
            answered_during_load += 1
    loader.join()
    assert loaded.is_set()
    assert answered_during_load > 0


def test_chat_streamed_whole_and_completions(server: ServerProcess) -> None:
    client = _client(server)
    whole = client.chat.completions.create(model="iso", messages=HI, max_tokens=8)  # type: ignore[arg-type]
    assert whole.choices[0].message.content
    assert whole.usage is not None and whole.usage.completion_tokens > 0
    chunks = client.chat.completions.create(
        model="iso",
        messages=HI,  # type: ignore[arg-type]
        max_tokens=8,
        stream=True,
        stream_options={"include_usage": True},
    )
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text
    done = client.completions.create(model="iso", prompt="The capital of France is", max_tokens=5)
    assert done.choices[0].text
    assert len(_children(server.proc.pid)) == 1


def test_embeddings_and_their_unload_leaves_no_child(server: ServerProcess) -> None:
    before = set(_children(server.proc.pid))
    got = _client(server).embeddings.create(model="vec", input=["one", "two"])
    assert len(got.data) == 2 and len(got.data[0].embedding) > 0
    (vec,) = set(_children(server.proc.pid)) - before
    _unload(server, "vec")
    assert not _alive(vec)
    assert set(_children(server.proc.pid)) == before


def test_a_disconnect_mid_stream_frees_the_slot(server: ServerProcess) -> None:
    body = {
        "model": "iso",
        "messages": HI,
        "max_tokens": LONG_TOKENS,
        "stream": True,
        **ENDLESS,
    }
    with httpx.stream(
        "POST", server.url + "/v1/chat/completions", json=body, timeout=model_scaled(LOAD_WAIT_S)
    ) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if '"content":"' in line:
                break  # one token came: leave
    # One slot: this is served only once the abandoned answer let it go.
    client = _client(server).with_options(timeout=model_scaled(POLL_S))
    answer = client.chat.completions.create(model="iso", messages=HI, max_tokens=4)  # type: ignore[arg-type]
    assert answer.choices[0].message.content is not None


def test_a_killed_child_fails_its_stream_and_the_next_call_starts_another(
    server: ServerProcess,
) -> None:
    client = _client(server)
    client.chat.completions.create(model="iso", messages=HI, max_tokens=2)  # type: ignore[arg-type]
    (child,) = [p for p in _children(server.proc.pid) if _alive(p)]
    body = {"model": "iso", "messages": HI, "max_tokens": LONG_TOKENS, "stream": True, **ENDLESS}
    lines = []
    with httpx.stream(
        "POST", server.url + "/v1/chat/completions", json=body, timeout=model_scaled(LOAD_WAIT_S)
    ) as r:
        for line in r.iter_lines():
            lines.append(line)
            if len(lines) == 1:
                os.kill(child, signal.SIGKILL)
    # The stream ends with an error event that says how the engine ended.
    assert any(f"{child} was killed by SIGKILL" in line for line in lines), lines[-3:]
    again = client.chat.completions.create(model="iso", messages=HI, max_tokens=2)  # type: ignore[arg-type]
    assert again.choices[0].message.content is not None
    (new,) = [p for p in _children(server.proc.pid) if _alive(p)]
    assert new != child


def test_unload_leaves_no_child(server: ServerProcess) -> None:
    client = _client(server)
    client.chat.completions.create(model="iso", messages=HI, max_tokens=2)  # type: ignore[arg-type]
    children = _children(server.proc.pid)
    assert children
    _unload(server, "iso")
    assert _children(server.proc.pid) == []
    assert not any(_alive(p) for p in children)


def test_a_killed_server_leaves_no_child(tmp_path: Path) -> None:
    spec = f"iso=llamacpp:{smollm2_path()}?engine=process&parallel=1&n_ctx=1024"
    s = start_server("--model", spec)
    (child,) = _children(s.proc.pid)
    os.kill(s.proc.pid, signal.SIGKILL)
    s.proc.wait()
    wait_until(lambda: not _alive(child), 30, "the orphaned child to exit", model=True)


def test_a_killed_child_is_failed_with_the_reason_until_a_new_one_serves(
    server: ServerProcess, weights: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    url, client = server.url, _client(server)
    before = _alive_children(server)
    client.chat.completions.create(model="frail", messages=HI, max_tokens=2)  # type: ignore[arg-type]
    (child,) = _alive_children(server) - before
    memory = model_metric(url, "zeroserve_model_memory_bytes", "frail")
    assert memory > 0
    gguf, away = weights / "frail.gguf", weights / "frail.away"
    gguf.rename(away)  # every new child fails to load until it is back
    try:
        os.kill(child, signal.SIGKILL)

        def failed() -> dict[str, object] | None:
            status = _status(server, "frail")
            return status if "starting another failed" in str(status.get("reason")) else None

        status = wait_until(failed, 60, "frail failed with the reason of its death", model=True)
        assert status["value"] == "loaded" and status["failed"] is True
        reason = str(status["reason"])
        assert f"{child} was killed by SIGKILL" in reason, reason
        assert "frail.gguf" in reason and str(weights) not in reason  # no server path
        cards = httpx.get(url + "/v1/models", timeout=scaled(30)).json()["data"]
        assert next(c for c in cards if c["id"] == "frail")["status"]["failed"] is True
        ready = httpx.get(url + "/ready", timeout=scaled(30))
        assert ready.status_code == 503
        frail = ready.json()["detail"]["models"]["frail"]
        assert frail["ready"] is False and f"{child} was killed by SIGKILL" in frail["reason"]
        assert main(["models", "--url", url]) == 0
        (line,) = [x for x in capsys.readouterr().out.splitlines() if x.startswith("frail ")]
        assert line.split()[1] == "failed" and "killed by SIGKILL" in line
        assert model_metric(url, "zeroserve_workers_crashes_total", "frail") == 1
        assert model_metric(url, "zeroserve_workers_restarts_total", "frail") == 0
    finally:
        away.rename(gguf)
    # The next request is served by a new child, and the model is itself again.
    answer = client.chat.completions.create(model="frail", messages=HI, max_tokens=2)  # type: ignore[arg-type]
    assert answer.choices[0].message.content is not None
    assert _status(server, "frail") == {"value": "loaded"}
    assert httpx.get(url + "/ready", timeout=scaled(30)).status_code == 200
    assert model_metric(url, "zeroserve_workers_restarts_total", "frail") == 1
    (new,) = _alive_children(server) - before
    assert new != child
    # Its memory is the new child's: measured again, about what the first one cost.
    again = model_metric(url, "zeroserve_model_memory_bytes", "frail")
    assert memory / 2 < again < memory * 2, (memory, again)
    # The new child's side port answers (its port and key are new).
    tokens = httpx.post(
        url + "/tokenize", json={"model": "frail", "prompt": "Hello"}, timeout=model_scaled(30)
    )
    assert tokens.status_code == 200 and tokens.json()["count"] > 0, tokens.text
    _unload(server, "frail")
    assert not _alive(new)


def test_rerank_through_the_child_scores_as_in_process(server: ServerProcess) -> None:
    before = _alive_children(server)
    answers = {}
    for name in ("rr", "rr_inline"):
        # /v1/rerank does not load a model on demand: load it first.
        load = httpx.post(
            server.url + "/models/load", json={"model": name}, timeout=model_scaled(LOAD_WAIT_S)
        )
        assert load.status_code == 200, load.text
        r = httpx.post(
            server.url + "/v1/rerank",
            json={"model": name, "query": QUERY, "documents": DOCS},
            timeout=model_scaled(LOAD_WAIT_S),
        )
        assert r.status_code == 200, r.text
        answers[name] = r.json()
        if name == "rr":
            assert len(_alive_children(server) - before) == 1  # served by its child
    results = answers["rr"]["results"]
    assert sorted(x["index"] for x in results) == list(range(len(DOCS)))  # 3 engine calls
    scores = [x["relevance_score"] for x in results]
    assert scores == sorted(scores, reverse=True)
    assert answers["rr"]["usage"]["prompt_tokens"] > 0
    inline = {x["index"]: x["relevance_score"] for x in answers["rr_inline"]["results"]}
    for x in results:
        assert x["relevance_score"] == pytest.approx(inline[x["index"]], abs=1e-4)
    for name in ("rr", "rr_inline"):
        _unload(server, name)
    assert _alive_children(server) == before


def test_a_child_killed_during_its_load_fails_the_load_with_the_reason(
    server: ServerProcess,
) -> None:
    url = server.url
    before = _alive_children(server)
    answers: list[httpx.Response] = []

    def load() -> None:
        answers.append(
            httpx.post(url + "/models/load", json={"model": "frail"}, timeout=model_scaled(60))
        )

    loader = threading.Thread(target=load)
    loader.start()
    (child,) = wait_until(lambda: _alive_children(server) - before, 30, "the child to start")
    os.kill(child, signal.SIGSTOP)  # held: its load cannot end now
    stopped = _state(server, "frail") == "loading"
    os.kill(child, signal.SIGKILL)
    loader.join()
    if not stopped:  # it had loaded before the stop: nothing to see this time
        _unload(server, "frail")
        pytest.skip("the child loaded before the test could stop it")
    (answer,) = answers
    assert answer.status_code == 500, answer.text
    assert "SIGKILL" in answer.json()["error"]["message"]
    status = _status(server, "frail")
    assert status["value"] == "unloaded" and status["failed"] is True
    assert f"{child} was killed by SIGKILL" in str(status["reason"])
    assert _alive_children(server) == before  # nothing left of it
    # The admin's load tries again at once, and serves.
    again = httpx.post(url + "/models/load", json={"model": "frail"}, timeout=model_scaled(60))
    assert again.status_code == 200, again.text
    assert _status(server, "frail") == {"value": "loaded"}
    _unload(server, "frail")
