"""What a test reads back from a running server or a held worker: a per-model metric from
``/metrics``, a FIFO a held worker waits on, the answers of a model whose only worker is
restarting (docs/architecture.md, "Deadlines"), and a server's file descriptors."""

from __future__ import annotations

import errno
import os
import re
from pathlib import Path

import httpx

from tests.support.timing import scaled

READ_S = 30.0


def model_metric(url: str, name: str, model: str) -> float:
    """The value of the per-model series ``name{name="model"}``, 0 while it is absent."""
    text = httpx.get(url + "/metrics", timeout=scaled(READ_S)).text
    m = re.search(rf'^{name}\{{name="{model}"\}} (\S+)$', text, re.M)
    return float(m.group(1)) if m else 0.0


def release_fifo(path: str) -> bool:
    """Write one byte to the FIFO at ``path``, letting one waiter on it go on; False while
    nothing reads it yet (the worker has not reached its wait)."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_NONBLOCK)
    except OSError as exc:
        if exc.errno == errno.ENXIO:
            return False
        raise
    try:
        os.write(fd, b"x")
    finally:
        os.close(fd)
    return True


def assert_restarting(url: str, model: str, reason: str, other: str = "echo") -> None:
    """``model`` has no worker to take work: ``/ready`` says so, naming ``reason``; a request
    to it is refused at the head with a 503 to retry; ``other`` still answers."""
    r = httpx.get(f"{url}/ready", timeout=scaled(READ_S))
    assert r.status_code == 503
    models = r.json()["detail"]["models"]
    assert models[model]["ready"] is False
    assert reason in models[model]["reason"]
    assert models[other]["ready"] is True
    r = httpx.post(f"{url}/v1/raw/{model}", content=b"ok", timeout=scaled(READ_S))
    assert r.status_code == 503, r.text
    assert int(r.headers["retry-after"]) >= 1
    assert r.json()["error"]["code"] == "worker_failed"
    answer = httpx.post(f"{url}/v1/raw/{other}", content=b"fine", timeout=scaled(READ_S))
    assert answer.content == b"fine"


def server_fds(pid: int, port: int) -> int:
    """``pid``'s file descriptors, less the connections of its HTTP clients on ``port``
    (a client's keep-alive connection may be open at one reading and closed by the
    server's idle timeout at the next: not the model's)."""
    clients = set()
    for table in ("tcp", "tcp6"):
        try:
            rows = Path(f"/proc/{pid}/net/{table}").read_text().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            f = row.split()
            if int(f[1].rsplit(":", 1)[1], 16) == port and f[3] != "0A":  # 0A: listening
                clients.add(f"socket:[{f[9]}]")
    links = []
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            links.append(os.readlink(f"/proc/{pid}/fd/{fd}"))
        except OSError:
            continue
    return sum(1 for link in links if link not in clients)
