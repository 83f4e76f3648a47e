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
* a child that dies unasked fails the calls in flight (503, with how it ended) and is
  started again at once by the thread that watched it die (back-off doubling from
  ``RESTART_BACKOFF_S`` while starts fail); a call that comes meanwhile waits for that
  start, or makes it. Until a new child answers, :attr:`ChildEngine.down` says why the
  engine cannot serve (the model is then not ready: docs/models.md, "Memory" and
  "Models at run time"), and :attr:`ChildEngine.pid` is None, so the model's memory is
  measured again on the new child, once it serves.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import logging
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
# Seconds before starting a dead child again once a start failed, doubled after each
# failed start up to RESTART_BACKOFF_MAX_S: the process executor's worker back-off
# (runtime/process/executor.py), so a GGUF gone from disk costs a child start a minute,
# not a busy loop.
RESTART_BACKOFF_S = 1.0
RESTART_BACKOFF_MAX_S = 60.0
# Bytes read per receive of a streamed answer (http.client's own buffer size).
_LINE_BYTES = 64 * 1024
_DATA = b"data: "
_ERROR = b"error: "
_DONE = b"[DONE]"

log = logging.getLogger("zeroserve")


class ChildEngine:
    """One child process serving one engine (``factory``: the model's class,
    ``module:qualname``; ``options``: its options, ``engine`` left out)."""

    def __init__(self, factory: str, location: str, options: Mapping[str, Any]) -> None:
        self._config = json.dumps(
            {"factory": factory, "location": location, "options": dict(options)}
        ).encode()
        self._lock = threading.Lock()  # one start or stop at a time
        self._noting = threading.Lock()  # one death noted once
        self._closed = threading.Event()  # stopped for good: no start; ends a back-off
        self._timeout = 0.0  # seconds a start may take (``start``'s)
        self.proc: subprocess.Popen[bytes] | None = None
        self.host = "127.0.0.1"
        self.port = 0
        self.key = ""
        # Why the engine cannot serve now: its child died unasked and no new one answers
        # yet (None: serving, or not started).
        self.down: str | None = None
        self.deaths = 0  # children that died unasked
        self.restarts = 0  # children started again after one died
        self._noted: subprocess.Popen[bytes] | None = None  # the last child noted dead

    @property
    def pid(self) -> int | None:
        """The serving child's process id (None while none serves: its memory is the
        model's only once it does)."""
        proc = self.proc
        return proc.pid if proc is not None and self.down is None else None

    @property
    def address(self) -> str:
        return f"http://{self.host}:{self.port}" if self.port else ""

    def start(self, timeout: float) -> None:
        """Start the child and return once its engine answers ``/health``; raises
        ``GGUFError`` with the child's reason when it cannot load (the child is gone).
        ``timeout`` bounds this start and every later one."""
        self._timeout = timeout
        with self._lock:
            self._start()

    def ensure(self) -> None:
        """Return once a child serves: at once while one does; else after starting one
        (or waiting for the start under way). Raises ``UpstreamUnavailable`` (503) with
        why none serves when a start fails or the engine was stopped."""
        if self.down is None and self.proc is not None:
            return
        with self._lock:
            if self._closed.is_set():
                raise UpstreamUnavailable("the llama.cpp process was stopped")
            if self.down is None:
                return  # started again while we waited
            dead = self.down.partition("; ")[0]
            self.down = f"{dead}; another is starting"
            try:
                self._kill()
                self._start()
            except Exception as exc:  # GGUFError, or no process could be started
                # The cause may name server paths: /ready and /models shorten it
                # (runtime/load_reasons.py), the log keeps it whole, a call gets neither.
                self.down = f"{dead}; starting another failed: {exc}"
                log.warning("%s", self.down)
                raise UpstreamUnavailable(f"{dead}; starting another failed") from None
            self.restarts += 1
            self.down = None

    def stop(self) -> None:
        """Kill the child's process group and reap it (idempotent); a start under way
        ends at once, and none follows."""
        self._closed.set()
        proc = self.proc
        if proc is not None:
            _kill_group(proc)  # a start holding the lock sees its child end
        with self._lock:
            self._kill()

    def _start(self) -> None:
        if self._closed.is_set():
            raise GGUFError("the llama.cpp process was stopped")
        timeout = self._timeout
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
            if not answer:  # it ended before a word: say how (its exit is near)
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(HEALTH_POLL_S * 20)
                raise GGUFError(f"the llama.cpp process {proc.pid} {_ended(proc)} while loading")
            ready = json.loads(answer)
            if "error" in ready:
                raise GGUFError(str(ready["error"]))
            self.port, self.key = int(ready["port"]), str(ready["key"])
            self._wait_health(proc, time.monotonic() + timeout)
        except BaseException:
            self._kill()
            raise
        threading.Thread(target=self._watch, args=(proc,), daemon=True).start()

    def _wait_health(self, proc: subprocess.Popen[bytes], end: float) -> None:
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
            if proc.poll() is not None:
                raise GGUFError(f"the llama.cpp process {proc.pid} {_ended(proc)}")
            if time.monotonic() > end:
                raise GGUFError("the llama.cpp process did not answer /health in time")
            time.sleep(HEALTH_POLL_S)

    def _watch(self, proc: subprocess.Popen[bytes]) -> None:
        """Wait for ``proc`` to end; one that died unasked is started again, at once, then
        after a back-off while starts fail, until one serves or ``stop``."""
        proc.wait()
        if not self._note_death(proc):
            return
        delay = RESTART_BACKOFF_S
        while not self._closed.is_set():
            try:
                self.ensure()
                return  # the new child has its own watcher
            except UpstreamUnavailable:
                pass
            if self._closed.wait(delay):
                return
            delay = min(delay * 2, RESTART_BACKOFF_MAX_S)

    def _note_death(self, proc: subprocess.Popen[bytes] | None) -> bool:
        """Record that ``proc``, the serving child, died unasked (once): True the first
        time; False for a child we stopped or one already noted."""
        with self._noting:
            if proc is None or proc is not self.proc or proc is self._noted:
                return False
            if proc.poll() is None or self._closed.is_set():
                return False
            self._noted = proc
            self.deaths += 1
            self.down = f"the llama.cpp process {proc.pid} {_ended(proc)}"
            return True

    def _kill(self) -> None:
        proc, self.proc = self.proc, None
        self.port = 0
        if proc is None:
            return
        _kill_group(proc)
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
        proc, conn, resp = self._post(path, payload)
        try:
            if resp.status != 200 or not resp.getheader("content-type", "").startswith(
                "text/event-stream"
            ):
                on_chunk(self._read(proc, resp))
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
            raise self._lost(proc, EOFError("the answer ended before its last event"))
        except (OSError, http.client.HTTPException) as exc:
            raise self._lost(proc, exc) from None
        finally:
            conn.close()

    def call(self, path: str, payload: bytes) -> bytes:
        """POST ``payload`` to ``path``: the engine's whole answer (an error's too)."""
        proc, conn, resp = self._post(path, payload)
        try:
            return self._read(proc, resp)
        finally:
            conn.close()

    def _post(
        self, path: str, payload: bytes
    ) -> tuple[subprocess.Popen[bytes], http.client.HTTPConnection, http.client.HTTPResponse]:
        proc, down = self.proc, self.down
        if down is not None or proc is None:
            # How the last child ended, not why a new one failed (that may name paths).
            raise UpstreamUnavailable(
                (down or "the llama.cpp process is not running").partition("; ")[0]
            )
        conn = http.client.HTTPConnection(self.host, self.port)
        try:
            conn.request(
                "POST",
                path,
                payload,
                {"Content-Type": "application/json", "Authorization": f"Bearer {self.key}"},
            )
            return proc, conn, conn.getresponse()
        except (OSError, http.client.HTTPException) as exc:
            conn.close()
            raise self._lost(proc, exc) from None

    def _read(self, proc: subprocess.Popen[bytes], resp: http.client.HTTPResponse) -> bytes:
        try:
            return resp.read()
        except (OSError, http.client.HTTPException) as exc:
            raise self._lost(proc, exc) from None

    def _lost(self, proc: subprocess.Popen[bytes], exc: BaseException) -> UpstreamUnavailable:
        """The error of a call whose exchange with ``proc`` broke: how ``proc`` ended,
        when it did (noted: it is started again)."""
        try:
            proc.wait(HEALTH_POLL_S * 20)  # a crash: its end is what the caller needs
        except subprocess.TimeoutExpired:
            return UpstreamUnavailable(f"the llama.cpp process broke the call: {exc}")
        self._note_death(proc)
        return UpstreamUnavailable(f"the llama.cpp process {proc.pid} {_ended(proc)}")


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


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
