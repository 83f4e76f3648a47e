"""A llama.cpp model whose engine runs in a child process (``engine=process``,
models/llamacpp_process.py; docs/architecture.md, "The llama.cpp backend").

Real SmolLM2 in a real server process (``zeroserve serve --models-dir``), driven by the
openai SDK and httpx. The child is found by PID among the server's children
(``/proc``), so "no child left" is checked on the process table itself.
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

from tests.support import ServerProcess, scaled, start_server, wait_until
from tests.support.smollm2 import require_llamacpp
from zeroserve.models.llamacpp import smollm2_path

require_llamacpp()

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
# abandoned one was stopped.
LONG_TOKENS = 4000
POLL_S = 30.0


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
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    root = tmp_path_factory.mktemp("models")
    for name, more in (("iso", ""), ("vec", 'embedding = true\npooling = "mean"\n')):
        (root / name).mkdir()
        (root / name / "model.toml").write_text(
            f'spec = "llamacpp:{smollm2_path()}"\n[options]\n'
            f'engine = "process"\nparallel = 1\nn_ctx = {N_CTX}\n{more}'
        )
    s = start_server("--models-dir", str(root), "--model", "echo")
    yield s
    assert s.stop() == 0
    assert _children(s.proc.pid) == []


def _client(server: ServerProcess) -> openai.OpenAI:
    return openai.OpenAI(
        base_url=server.url + "/v1", api_key="none", max_retries=0, timeout=scaled(LOAD_WAIT_S)
    )


def _state(server: ServerProcess, name: str) -> str:
    models = httpx.get(server.url + "/models").json()["data"]
    return str(next(m for m in models if m["id"] == name)["status"]["value"])


def test_health_answers_while_the_child_loads(server: ServerProcess) -> None:
    loaded = threading.Event()

    def load() -> None:
        r = httpx.post(server.url + "/models/load", json={"model": "iso"}, timeout=scaled(60))
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
    httpx.post(server.url + "/models/unload", json={"model": "vec"}).raise_for_status()
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
    with httpx.stream("POST", server.url + "/v1/chat/completions", json=body) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if '"content":"' in line:
                break  # one token came: leave
    # One slot: this is served only once the abandoned answer let it go.
    client = _client(server).with_options(timeout=scaled(POLL_S))
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
    with httpx.stream("POST", server.url + "/v1/chat/completions", json=body) as r:
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
    httpx.post(server.url + "/models/unload", json={"model": "iso"}).raise_for_status()
    assert _children(server.proc.pid) == []
    assert not any(_alive(p) for p in children)


def test_a_killed_server_leaves_no_child(tmp_path: Path) -> None:
    spec = f"iso=llamacpp:{smollm2_path()}?engine=process&parallel=1&n_ctx=1024"
    s = start_server("--model", spec)
    (child,) = _children(s.proc.pid)
    os.kill(s.proc.pid, signal.SIGKILL)
    s.proc.wait()
    wait_until(lambda: not _alive(child), 30, "the orphaned child to exit")
