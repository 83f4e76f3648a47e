"""Hung and crashing models, over loopback: a process worker hung past its deadline is
killed and restarted (the restart counted), a thread executor whose every slot is stuck
is not ready and answers fast 503s with Retry-After; every gauge returns to idle. The
same holds for a stream whose step hangs (thread: each holds a pool thread until the pool
is exhausted; process: the worker is killed and restarted).

The server here has a 30 s request limit and a short hang grace; requests that should
hang ask for a short ``?timeout=``. Clients give up after ``CLIENT_WAIT_S`` (10 s), so a
503 or 504 they get can only come from the mechanisms under test.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.support import ServerThread, scaled, wait_until
from tests.support.models import misbehaving as fm
from zeroserve.runtime import ModelConfig, ModelStatistics, RuntimeOptions
from zeroserve.runtime.inproc import STREAM_THREADS
from zeroserve.runtime.process.worker import WORKER_THREADS

CLIENT_WAIT_S = scaled(10.0)
# How long a test waits for the server to reach a state (a restart, a stuck count).
STATE_WAIT_S = 30.0
HANG_GRACE_S = 0.3
HANG_TIMEOUT = "?timeout=0.3"
# The OpenAI routes' client timeout for a stream that should hang, seconds.
HANG_SDK_TIMEOUT = {"x-stainless-timeout": "0.3"}


@pytest.fixture(scope="module")
def hung_server() -> Iterator[ServerThread]:
    fm.RELEASE.clear()
    configs = {
        "hang-thread": ModelConfig("hang-thread", fm.HangThreadModel),
        "hang-proc": ModelConfig("hang-proc", fm.HangProcessModel),
        "hang-stream": ModelConfig("hang-stream", fm.HangStreamThreadModel),
        "hang-eager": ModelConfig("hang-eager", fm.HangEagerThreadModel),
    }
    srv = ServerThread(
        configs, runtime=RuntimeOptions(default_deadline_s=30.0, hang_grace_s=HANG_GRACE_S)
    ).start()
    yield srv
    fm.RELEASE.set()
    srv.stop()


def stats(srv: ServerThread, model: str) -> ModelStatistics:
    async def read() -> ModelStatistics:
        assert srv.engine is not None
        return srv.engine.model(model).statistics()

    return srv.call(read())


def idle(srv: ServerThread, model: str) -> bool:
    s = stats(srv, model)
    return (
        s.queue.in_flight == 0
        and s.workers.busy == 0
        and s.workers.streams == 0
        and s.workers.stuck == 0
        and s.workers.ready == s.workers.workers
    )


def raw(srv: ServerThread, model: str, body: bytes, query: str = "") -> httpx.Response:
    return httpx.post(f"{srv.url}/v1/raw/{model}{query}", content=body, timeout=CLIENT_WAIT_S)


async def _concurrently(srv: ServerThread, calls: list[tuple[str, bytes, str]]) -> list[Any]:
    async with httpx.AsyncClient(base_url=srv.url, timeout=CLIENT_WAIT_S) as client:
        return await asyncio.gather(
            *(client.post(f"/v1/raw/{m}{q}", content=b) for m, b, q in calls),
            return_exceptions=True,
        )


def concurrently(srv: ServerThread, calls: list[tuple[str, bytes, str]]) -> list[Any]:
    return asyncio.run(_concurrently(srv, calls))


def complete_stream(
    srv: ServerThread, model: str, prompt: str, headers: dict[str, str] | None = None
) -> tuple[int, str, str | None]:
    """A streamed completion: its status, its text, and the code of its final error
    event (None when it ended with ``[DONE]``)."""
    body = {"model": model, "prompt": prompt, "stream": True, "max_tokens": 4}
    with httpx.stream(
        "POST",
        srv.url + "/v1/completions",
        json=body,
        headers=headers or {},
        timeout=CLIENT_WAIT_S,
    ) as r:
        if r.status_code != 200:
            r.read()
            return r.status_code, r.text, None
        events = [line[6:] for line in r.iter_lines() if line.startswith("data: ")]
    if events[-1] == "[DONE]":
        docs = [json.loads(e) for e in events[:-1]]
        return 200, "".join(d["choices"][0]["text"] for d in docs), None
    docs = [json.loads(e) for e in events]
    code = docs[-1]["error"]["code"]
    return 200, "".join(d["choices"][0]["text"] for d in docs[:-1]), code


# -- thread: stuck slots make the model not ready --------------------------------------------
def test_thread_executor_with_every_slot_stuck_is_not_ready(hung_server: ServerThread) -> None:
    srv = hung_server
    model = "hang-thread"
    assert raw(srv, model, b"ok").content == b"ok"
    workers = stats(srv, model).workers.workers
    # Hang every slot: each request gets its 504 at its own short deadline.
    answers = concurrently(srv, [(model, b"hang", HANG_TIMEOUT)] * workers)
    assert [r.status_code for r in answers] == [504] * workers
    wait_until(lambda: stats(srv, model).workers.stuck == workers, STATE_WAIT_S, "every slot stuck")
    # Not ready, and /ready names the model.
    r = httpx.get(srv.url + "/ready", timeout=CLIENT_WAIT_S)
    assert r.status_code == 503
    models = r.json()["detail"]["models"]
    assert models[model]["ready"] is False
    assert models["hang-proc"]["ready"] is True
    r = httpx.get(f"{srv.url}/v2/models/{model}/ready", timeout=CLIENT_WAIT_S)
    assert (r.status_code, r.json()["ready"]) == (400, False)
    # New requests are refused at the head with 503 + Retry-After, not queued into a dead
    # model until their (30 s) deadline.
    for _ in range(3):
        r = raw(srv, model, b"ok")
        assert r.status_code == 503, r.text
        assert int(r.headers["retry-after"]) >= 1
        assert r.json()["error"]["type"] == "rate_limit_error"
    # The other model is unaffected.
    assert raw(srv, "hang-proc", b"fine").content == b"fine"
    # When the threads return, the slots are free and the model is ready again.
    fm.RELEASE.set()
    wait_until(lambda: idle(srv, model), STATE_WAIT_S, "slots freed")
    assert httpx.get(srv.url + "/ready", timeout=CLIENT_WAIT_S).status_code == 200
    assert raw(srv, model, b"again").content == b"again"
    fm.RELEASE.clear()


# -- process: hung workers are killed and restarted -----------------------------------------
def test_process_worker_hung_past_its_deadline_is_restarted(hung_server: ServerThread) -> None:
    srv = hung_server
    model = "hang-proc"
    before = stats(srv, model).workers
    # More hung calls than the worker has threads (8): without reclaim the worker would be
    # exhausted after them and answer nothing but 504s.
    rounds = 10
    for i in range(rounds):
        r = raw(srv, model, b"hang", HANG_TIMEOUT)
        assert r.status_code == 504, r.text
        # Until the hung worker is killed it takes no work: a request now is refused at
        # once (503) or waits for the restarted worker (200); never a 504 after a deadline.
        r = raw(srv, model, b"ok")
        assert r.status_code in (200, 503), r.text
        if r.status_code == 503:
            assert "retry-after" in r.headers
        wait_until(
            lambda i=i: (
                stats(srv, model).workers.reclaimed == before.reclaimed + i + 1 and idle(srv, model)
            ),
            STATE_WAIT_S,
            "the hung worker restarted",
        )
    after = stats(srv, model).workers
    assert after.reclaimed == before.reclaimed + rounds
    assert after.restarts == before.restarts + rounds
    assert after.crashes == before.crashes  # a reclaim is not a crash
    assert raw(srv, model, b"served").content == b"served"
    assert httpx.get(srv.url + "/ready", timeout=CLIENT_WAIT_S).status_code == 200


def test_other_requests_on_a_hung_worker_get_503(hung_server: ServerThread) -> None:
    srv = hung_server
    model = "hang-proc"
    before = stats(srv, model).workers.reclaimed
    with httpx.stream(
        "POST",
        f"{srv.url}/v1/raw/{model}?stream=1&max_tokens=100000",
        content=b"x",
        timeout=CLIENT_WAIT_S,
    ) as stream:
        assert stream.status_code == 200
        pieces = stream.iter_raw()
        assert next(pieces)  # the stream runs on the worker
        r = raw(srv, model, b"hang", HANG_TIMEOUT)
        assert r.status_code == 504
        # The worker is killed: the stream on it is cut (a raw chunked stream signals a
        # failed transfer by ending early).
        with pytest.raises(httpx.RemoteProtocolError):
            for _ in pieces:
                pass
    wait_until(lambda: stats(srv, model).workers.reclaimed == before + 1, STATE_WAIT_S, "restart")
    wait_until(lambda: idle(srv, model), STATE_WAIT_S, "idle")


def test_worker_crash_mid_batch(hung_server: ServerThread) -> None:
    srv = hung_server
    model = "hang-proc"
    before = stats(srv, model).workers
    answers = concurrently(srv, [(model, b"a", ""), (model, b"crash", ""), (model, b"b", "")])
    statuses = [r.status_code for r in answers]
    assert statuses[1] == 503
    assert all(s in (200, 503) for s in statuses), statuses
    for r in answers:
        if r.status_code == 503:
            assert r.json()["error"]["code"] == "worker_failed"
    wait_until(
        lambda: stats(srv, model).workers.restarts == before.restarts + 1 and idle(srv, model),
        STATE_WAIT_S,
        "restart after the crash",
    )
    assert stats(srv, model).workers.crashes == before.crashes + 1
    assert raw(srv, model, b"after").content == b"after"


# -- hung stream steps ------------------------------------------------------------------------
def test_thread_generate_that_hangs_in_its_call_leaves_the_loop_free(
    hung_server: ServerThread,
) -> None:
    """A plain ``generate`` does its work in the call; on the thread executor that call is
    the stream's first step, on a pool thread: a hang there is watched like a hung step,
    and the loop keeps serving."""
    srv = hung_server
    model = "hang-eager"
    assert complete_stream(srv, model, "ok") == (200, "first done", None)
    with (
        httpx.Client(base_url=srv.url, timeout=CLIENT_WAIT_S) as client,
        client.stream(
            "POST",
            "/v1/completions",
            json={"model": model, "prompt": "hang", "stream": True},
            headers=HANG_SDK_TIMEOUT,
        ) as hanging,
    ):
        # Answered while the call hangs: the loop is not the thread it hangs on.
        assert client.get("/health").status_code == 200
        # No piece came before the deadline: a 504 in OpenAI's format.
        hanging.read()
        assert hanging.status_code == 504, hanging.text
        assert json.loads(hanging.text)["error"]["code"] == "deadline_exceeded"
    wait_until(
        lambda: stats(srv, model).workers.stuck == 1, STATE_WAIT_S, "the hung call counted stuck"
    )
    assert complete_stream(srv, model, "ok") == (200, "first done", None)
    fm.RELEASE.set()
    wait_until(lambda: idle(srv, model), STATE_WAIT_S, "its thread freed")
    fm.RELEASE.clear()


def test_thread_stream_steps_hung_until_the_pool_is_exhausted(hung_server: ServerThread) -> None:
    srv = hung_server
    model = "hang-stream"
    assert complete_stream(srv, model, "ok") == (200, "first done", None)
    workers = stats(srv, model).workers.workers
    threads = workers + STREAM_THREADS
    for hung in range(1, threads + 1):
        # The stream gets its first piece, then its final error event at its deadline.
        assert complete_stream(srv, model, "hang", HANG_SDK_TIMEOUT) == (
            200,
            "first",
            "deadline_exceeded",
        )
        # Its step's thread is counted stuck once it ran the grace past the deadline.
        wait_until(
            lambda hung=hung: stats(srv, model).workers.stuck == hung, STATE_WAIT_S, f"{hung} stuck"
        )
        s = stats(srv, model)
        assert (s.workers.streams, s.queue.in_flight, s.workers.busy) == (0, 0, 0)
        # Batches that could still run: every slot, while a thread is left for each.
        capacity = min(workers, threads - hung)
        assert s.workers.ready == capacity
        ready = httpx.get(srv.url + "/ready", timeout=CLIENT_WAIT_S)
        if capacity:
            assert ready.status_code == 200
            assert complete_stream(srv, model, "ok") == (200, "first done", None)
            continue
        # The pool is exhausted: not ready, /ready names the model, requests are 503
        # with Retry-After at the head.
        assert ready.status_code == 503
        models = ready.json()["detail"]["models"]
        assert models[model]["ready"] is False
        assert models["hang-thread"]["ready"] is True
        status, text, _ = complete_stream(srv, model, "ok")
        assert status == 503, text
        assert json.loads(text)["error"]["type"] == "rate_limit_error"
        r = httpx.post(
            srv.url + "/v1/completions",
            json={"model": model, "prompt": "ok", "stream": True},
            timeout=CLIENT_WAIT_S,
        )
        assert r.status_code == 503
        assert int(r.headers["retry-after"]) >= 1
    assert stats(srv, model).queue.in_flight == 0
    # When the steps return, their threads are free and the model serves again.
    fm.RELEASE.set()
    wait_until(lambda: idle(srv, model), STATE_WAIT_S, "threads freed")
    assert httpx.get(srv.url + "/ready", timeout=CLIENT_WAIT_S).status_code == 200
    assert complete_stream(srv, model, "ok") == (200, "first done", None)
    fm.RELEASE.clear()


def test_process_stream_step_hung_past_its_deadline_is_restarted(
    hung_server: ServerThread,
) -> None:
    srv = hung_server
    model = "hang-proc"
    before = stats(srv, model).workers
    # More hung steps than the worker has threads: without reclaim it would be exhausted.
    rounds = WORKER_THREADS + 1
    for i in range(rounds):
        assert complete_stream(srv, model, "hang", HANG_SDK_TIMEOUT) == (
            200,
            "first",
            "deadline_exceeded",
        )
        # Until the hung worker is killed it takes no work: refused at once (503) or
        # served by the restarted worker; never a 504 after a deadline.
        status, text, code = complete_stream(srv, model, "ok")
        assert status in (200, 503), text
        assert code is None
        wait_until(
            lambda i=i: (
                stats(srv, model).workers.reclaimed == before.reclaimed + i + 1 and idle(srv, model)
            ),
            STATE_WAIT_S,
            "the hung worker restarted",
        )
    after = stats(srv, model).workers
    assert after.reclaimed == before.reclaimed + rounds
    assert after.restarts == before.restarts + rounds
    assert after.crashes == before.crashes
    assert httpx.get(srv.url + "/ready", timeout=CLIENT_WAIT_S).status_code == 200


def test_other_streams_on_a_worker_with_a_hung_step_are_cut(hung_server: ServerThread) -> None:
    srv = hung_server
    model = "hang-proc"
    before = stats(srv, model).workers.reclaimed
    body = {"model": model, "prompt": "long", "stream": True, "max_tokens": 100000}
    with httpx.stream(
        "POST", srv.url + "/v1/completions", json=body, timeout=CLIENT_WAIT_S
    ) as stream:
        assert stream.status_code == 200
        lines = stream.iter_lines()
        assert next(line for line in lines if line.startswith("data: "))  # running
        assert complete_stream(srv, model, "hang", HANG_SDK_TIMEOUT)[2] == "deadline_exceeded"
        # The worker is killed for the hung step: the stream on it ends with a 503 error
        # event naming the dead worker.
        events = [line[6:] for line in lines if line.startswith("data: ")]
    err = json.loads(events[-1])["error"]
    assert err["code"] == "worker_failed", err
    wait_until(lambda: stats(srv, model).workers.reclaimed == before + 1, STATE_WAIT_S, "restart")
    wait_until(lambda: idle(srv, model), STATE_WAIT_S, "idle")
