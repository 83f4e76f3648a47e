"""A llama.cpp engine in a child process the model owns (``engine=process``;
docs/architecture.md, "The llama.cpp backend").

``xllamacpp.Server(params)`` holds the GIL for its whole load (about a second for
SmolLM2), so an in-process load stops the event loop and every stream on it
(docs/decisions/0040-model-memory-measured-and-loads-wait-for-room.md). With
``engine=process`` the engine is built in a child instead, and the parent talks to the
child's own llama.cpp HTTP server on loopback (docs/decisions/0050-llamacpp-engine-in-a-child-process.md).

Invariants:

* the child runs in a process group of its own; :meth:`ChildEngine.stop` kills that
  group and reaps it, at unload, replacement, shutdown and after a failed load;
* no orphan: the child reads its stdin, a pipe whose write end only the parent holds,
  until end of file, then exits at once. A parent that dies, SIGKILL included, closes it
  (``PR_SET_PDEATHSIG`` is not used: it fires when the *thread* that forked exits, and
  loads run on pool threads);
* the side port's key is made in the child and handed over on its stdout pipe: it is
  never in an argument, an environment or a file;
* a streamed call is one HTTP exchange whose SSE events reach the same ``on_chunk`` as
  the in-process engine's chunks (the ``data:`` payloads, ``[DONE]`` left out). When
  ``on_chunk`` asks to stop, the connection is closed: llama.cpp sees it and frees the
  slot at its next token;
* a child that dies fails the calls in flight (503, with how it ended) and is started
  again by the next call.
"""

from __future__ import annotations

import http.client
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping
from typing import IO, Any, Protocol, runtime_checkable

from ..errors import GGUFError, UpstreamUnavailable

# Seconds between two looks at the child's ``/health`` once it said where it listens
# (the engine answers 200 once its model is loaded, which is already true then).
HEALTH_POLL_S = 0.05
# Seconds a stopped (SIGKILLed) child may take to be reaped before we give up waiting.
REAP_TIMEOUT_S = 10.0
# Bytes read per receive of a streamed answer (http.client's own buffer size).
_LINE_BYTES = 64 * 1024
_DATA = b"data: "
_ERROR = b"error: "
_DONE = b"[DONE]"


class ChildEngine:
    """One child process serving one engine (``factory``: the model's class,
    ``module:qualname``; ``options``: its options, ``engine`` left out)."""

    def __init__(self, factory: str, location: str, options: Mapping[str, Any]) -> None:
        self._config = json.dumps(
            {"factory": factory, "location": location, "options": dict(options)}
        ).encode()
        self._lock = threading.Lock()  # one start or stop at a time
        self.proc: subprocess.Popen[bytes] | None = None
        self.host = "127.0.0.1"
        self.port = 0
        self.key = ""
        self._stopping = False
        # How the last child ended when it was not stopped by us (None: alive or stopped).
        self.died: str | None = None

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None else None

    @property
    def address(self) -> str:
        return f"http://{self.host}:{self.port}" if self.port else ""

    def start(self, timeout: float) -> None:
        """Start the child and return once its engine answers ``/health``; raises
        ``GGUFError`` with the child's reason when it cannot load (the child is gone)."""
        with self._lock:
            self._start(timeout)

    def restart(self, timeout: float) -> None:
        """Start a new child if the last one died (the next call after a crash)."""
        with self._lock:
            if self.died is not None:
                self._kill()
                self._start(timeout)

    def stop(self) -> None:
        """Kill the child's process group and reap it (idempotent)."""
        with self._lock:
            self._kill()

    def _start(self, timeout: float) -> None:
        self._stopping = False
        self.died = None
        proc = subprocess.Popen(
            [sys.executable, "-m", __name__],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            start_new_session=True,  # its own process group: one kill stops it all
        )
        self.proc = proc
        assert proc.stdin is not None and proc.stdout is not None
        try:
            proc.stdin.write(self._config + b"\n")
            proc.stdin.flush()  # the pipe stays open: its end of file is our death
            answer = _read_line(proc.stdout, timeout)
            ready = json.loads(answer) if answer else {"error": _ended(proc)}
            if "error" in ready:
                raise GGUFError(str(ready["error"]))
            self.port, self.key = int(ready["port"]), str(ready["key"])
            self._wait_health(time.monotonic() + timeout)
        except BaseException:
            self._kill()
            raise
        threading.Thread(target=self._watch, args=(proc,), daemon=True).start()

    def _wait_health(self, end: float) -> None:
        while True:
            conn = http.client.HTTPConnection(self.host, self.port, timeout=HEALTH_POLL_S * 20)
            try:
                conn.request("GET", "/health")
                if conn.getresponse().status == 200:
                    return
            except OSError:
                pass
            finally:
                conn.close()
            if time.monotonic() > end:
                raise GGUFError("the llama.cpp process did not answer /health in time")
            time.sleep(HEALTH_POLL_S)

    def _watch(self, proc: subprocess.Popen[bytes]) -> None:
        proc.wait()
        if not self._stopping and proc is self.proc:
            self.died = f"the llama.cpp process {proc.pid} {_ended(proc)}"

    def _kill(self) -> None:
        proc, self.proc = self.proc, None
        self.port = 0
        if proc is None:
            return
        self._stopping = True
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        try:
            proc.wait(REAP_TIMEOUT_S)
        finally:
            for pipe in (proc.stdin, proc.stdout):
                if pipe is not None:
                    pipe.close()

    # -- calls (blocking: each runs in one of the runtime's slot threads) -----------------
    def stream(self, path: str, payload: bytes, on_chunk: Callable[[bytes], bool]) -> None:
        """POST ``payload`` to ``path`` and hand each SSE event's payload (or a refusal's
        ``{"error": ...}`` body) to ``on_chunk``; its True closes the connection."""
        conn, resp = self._post(path, payload)
        try:
            if resp.status != 200 or not resp.getheader("content-type", "").startswith(
                "text/event-stream"
            ):
                on_chunk(self._read(resp))
                return
            while line := resp.readline(_LINE_BYTES):
                if line.startswith(_DATA):
                    data = line[len(_DATA) :].rstrip()
                    if data == _DONE:
                        return
                elif line.startswith(_ERROR):
                    data = b'{"error":' + line[len(_ERROR) :].rstrip() + b"}"
                else:
                    continue
                if on_chunk(data):
                    return  # closing the connection stops the slot
            raise self._lost(EOFError("the answer ended before its last event"))
        except (OSError, http.client.HTTPException) as exc:
            raise self._lost(exc) from None
        finally:
            conn.close()

    def call(self, path: str, payload: bytes) -> bytes:
        """POST ``payload`` to ``path``: the engine's whole answer (an error's too)."""
        conn, resp = self._post(path, payload)
        try:
            return self._read(resp)
        finally:
            conn.close()

    def _post(
        self, path: str, payload: bytes
    ) -> tuple[http.client.HTTPConnection, http.client.HTTPResponse]:
        if self.died is not None or self.proc is None:
            raise UpstreamUnavailable(self.died or "the llama.cpp process is not running")
        conn = http.client.HTTPConnection(self.host, self.port)
        try:
            conn.request(
                "POST",
                path,
                payload,
                {"Content-Type": "application/json", "Authorization": f"Bearer {self.key}"},
            )
            return conn, conn.getresponse()
        except (OSError, http.client.HTTPException) as exc:
            conn.close()
            raise self._lost(exc) from None

    def _read(self, resp: http.client.HTTPResponse) -> bytes:
        try:
            return resp.read()
        except (OSError, http.client.HTTPException) as exc:
            raise self._lost(exc) from None

    def _lost(self, exc: BaseException) -> UpstreamUnavailable:
        proc = self.proc
        if proc is not None:
            try:
                proc.wait(HEALTH_POLL_S * 20)  # a crash: let the watcher record it
            except subprocess.TimeoutExpired:
                pass
        self._watch_now(proc)
        return UpstreamUnavailable(self.died or f"the llama.cpp process broke the call: {exc}")

    def _watch_now(self, proc: subprocess.Popen[bytes] | None) -> None:
        if proc is not None and proc.poll() is not None and not self._stopping:
            self.died = f"the llama.cpp process {proc.pid} {_ended(proc)}"


def _read_line(pipe: IO[bytes], timeout: float) -> bytes:
    """One line from ``pipe`` within ``timeout`` seconds (b"" at its end)."""
    got: list[bytes] = []
    reader = threading.Thread(target=lambda: got.append(pipe.readline()), daemon=True)
    reader.start()
    reader.join(timeout)
    if reader.is_alive():
        raise GGUFError(f"the llama.cpp process did not load its model in {timeout} s")
    return got[0] if got else b""


def _ended(proc: subprocess.Popen[bytes]) -> str:
    code = proc.poll()
    if code is None:
        return "is running"
    if code < 0:
        return f"was killed by {signal.Signals(-code).name}"
    return f"exited with status {code}"


# -- the child ---------------------------------------------------------------------------
@runtime_checkable
class _Engine(Protocol):
    """What the child needs of the model it loads (``LlamaCppModel``)."""

    @property
    def side_address(self) -> str: ...

    @property
    def side_key(self) -> str: ...

    def load(self) -> None: ...


def _orphan_guard(stdin: IO[bytes]) -> None:
    """Exit at once when the parent's end of our stdin closes (the parent died)."""
    while stdin.read(_LINE_BYTES):
        pass
    os._exit(0)


def main() -> None:
    """The child: load the engine as an in-process model would, say where it listens
    (one JSON line on the stdout pipe), then serve until the parent goes."""
    from .loader import load_class

    out = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)  # anything the engine prints goes to stderr, never into our answer
    config = json.loads(sys.stdin.buffer.readline())
    threading.Thread(target=_orphan_guard, args=(sys.stdin.buffer,), daemon=True).start()
    try:
        cls = load_class(config["factory"])
        where = {"location": config["location"]} if config["location"] else {}
        model = cls(**where, **config["options"])
        assert isinstance(model, _Engine), "the child serves a llama.cpp model"
        model.load()
        port = int(model.side_address.rpartition(":")[2])
        key = model.side_key
    except Exception as exc:
        out.write(json.dumps({"error": str(exc)}) + "\n")
        out.flush()
        os._exit(1)
    out.write(json.dumps({"port": port, "key": key}) + "\n")
    out.flush()
    threading.Event().wait()  # the engine's threads serve; _orphan_guard ends us


if __name__ == "__main__":
    main()
