"""The batch runner: one task on the event loop that validates new batches (each in a
thread), runs their lines, and ends them (docs/architecture.md, "The Batch API").

How a line runs
---------------
Through the same handler as its HTTP route, not a loopback request: the router finds the
route of the line's ``url``, and a :class:`~..request.Request` over the line's body, with
the batch's ``priority``, goes to the route's handler, so the
backend table, the chat translation, admission, the model's limits and ``remote:``
models all apply as they do to an HTTP request. The handler's answer (a whole
``Response``: streaming lines are refused at validation) is the line's result. The
line's edge context holds the submitting key's quota for the line's duration and its
tokens are counted on it, so a batch counts against its key's quotas.

Yielding to interactive work
----------------------------
Every line carries ``BATCH_PRIORITY`` (the lowest class). Until admission orders its
queue by class, the runner bounds itself: per model, ``lines_per_model`` lines in
flight while the model has no other admitted request, and one
(``LINES_BESIDE_INTERACTIVE``) while it has; the bound is taken again each time a line
ends. A line refused by admission or by its key's quota (429/503) is not failed: it
waits out the ``Retry-After`` and runs again.

Durability: a line's result is committed with its completion (``store``); lines in
flight when the process dies are pending after restart and run then.

Several workers
---------------
Worker processes may share the store. Each runner works only on the batches whose lease
it holds (``store.take_lease``: a conditional upsert), renews them every
``LEASE_RENEW_S`` and commits a line or ends a batch only while it still holds the
lease, so exactly one runner's results count. A killed worker's leases are taken over
once expired (``LEASE_S``), or at once when its pid is gone on this host.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import os
import re
import secrets
import socket
import sqlite3
import time
from collections import Counter
from collections.abc import Callable, Iterator

import msgspec

from ...edge import Edge
from ...errors import Overloaded, ZeroserveError
from ...http.connection import RequestHead
from ...runtime import Engine
from ..problems import error_body
from ..request import Request
from ..response import Response, StreamResponse
from ..router import Router
from . import schemas as s
from .options import (
    BATCH_PRIORITY,
    LEASE_RENEW_S,
    LEASE_S,
    LINES_BESIDE_INTERACTIVE,
    SCHEDULE_WINDOW,
    BatchOptions,
)
from .store import BatchStore, NewLine

log = logging.getLogger("zeroserve.batch")

# The pause before a line's commit is tried again after the store's busy wait ran out,
# seconds: about one short write of another process.
COMMIT_RETRY_S = 0.02

_BLANK = re.compile(rb"\s*")


class _Retry(Exception):
    def __init__(self, after: float) -> None:
        super().__init__(after)
        self.after = after


def _request_id() -> str:
    return "batch_req_" + secrets.token_hex(12)


def _error_line(custom_id: str | None, code: str, message: str) -> bytes:
    return s.encoder.encode(
        s.LineResult(
            id=_request_id(), custom_id=custom_id, error=s.LineError(code=code, message=message)
        )
    )


class BatchRunner:
    """Runs the open batches of ``store``. ``clock``: monotonic seconds (retries)."""

    def __init__(
        self,
        store: BatchStore,
        options: BatchOptions,
        router: Router,
        engine: Engine,
        edge: Edge,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.store = store
        self.options = options
        self.router = router
        self.engine = engine
        self.edge = edge
        self._clock = clock
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._lines: set[asyncio.Task[None]] = set()
        self._validating: dict[str, asyncio.Task[None]] = {}  # batch -> its validation
        self._flight: dict[str, dict[int, str]] = {}  # batch -> {line index: model}
        self._per_model: Counter[str] = Counter()  # lines started, per model
        self._admitted: Counter[str] = Counter()  # of which admitted (holding tickets)
        self._held: dict[tuple[str, int], float] = {}  # refused lines -> when to retry
        self.lines_run = 0  # lines whose handler ran to an answer (statistics, tests)
        # This runner's name in the leases: host/pid/nonce (the pid: a takeover at once
        # when it is gone; the nonce: a restarted worker that reuses a pid is another).
        self.holder = f"{socket.gethostname()}/{os.getpid()}/{secrets.token_hex(4)}"
        self._leases: dict[str, float] = {}  # batch -> when our lease on it ends

    # -- lifecycle -------------------------------------------------------------------------
    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._main(), name="batch-runner")

    def wake(self) -> None:
        """Something changed (a batch created or cancelled, a line ended): look again."""
        self._wake.set()

    async def aclose(self) -> None:
        """Stop: lines in flight are cancelled and stay pending (run after a restart)."""
        tasks = [t for t in (self._task, *self._lines, *self._validating.values()) if t]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._task = None
        for bid in self._leases:  # another worker (or this one restarted) goes on at once
            try:
                self.store.release_lease(bid, self.holder)
            except Exception:
                log.exception("releasing the lease on batch %s failed", bid)
        self._leases.clear()

    async def _main(self) -> None:
        while True:
            self._wake.clear()
            try:
                delay = self.step()
            except Exception:
                log.exception("the batch runner's pass failed; retrying")
                delay = 1.0
            try:
                await asyncio.wait_for(self._wake.wait(), delay)
            except TimeoutError:
                pass

    # -- one pass over the open batches ----------------------------------------------------
    def step(self) -> float:
        """Advance every open batch; the seconds until a timed event (retry, expiry)."""
        store = self.store
        now_wall = store.now()
        wait: list[float] = []
        batches = store.open_batches()
        for gone in self._leases.keys() - {b.id for b in batches}:
            del self._leases[gone]
        for batch in batches:
            bid = batch.id
            flying = self._flight.get(bid)
            free_in = self._hold(bid)
            if free_in is not None:
                wait.append(free_in)  # another worker runs it: look again when it may end
                continue
            wait.append(LEASE_RENEW_S)  # renew the lease, and read its status again
            if bid in self._validating:
                continue  # its thread is still inserting its lines
            if batch.status == "validating":
                self._start_validating(batch)
            elif batch.status == "cancelling":
                if not flying:
                    self._end(batch, "cancelled")
            elif batch.status == "finalizing":
                self._end(batch, "completed")
            elif batch.expires_at is not None and now_wall >= batch.expires_at:
                if not flying:
                    self._end(batch, "expired")
            else:
                if batch.expires_at is not None:
                    wait.append(batch.expires_at - now_wall)
                _, _, pending = store.counts(bid)
                if not pending and not flying:
                    store.set_finalizing(bid)
                    self._end(batch, "completed")
                elif pending:
                    retry = self._schedule(batch, pending)
                    if retry is not None:
                        wait.append(retry)
        # Idle, it still looks every LEASE_S: a batch created through another worker is
        # this runner's to take over if that worker dies (nothing wakes this one then).
        return max(0.0, min(wait)) if wait else LEASE_S

    def _hold(self, bid: str) -> float | None:
        """None when this runner holds ``bid``'s lease (renewed when due, taken when
        free); else the seconds until the other holder's lease ends."""
        now = self.store.lease_clock()
        until = self._leases.get(bid)
        if until is not None and until - now > LEASE_S - LEASE_RENEW_S:
            return None
        held = self.store.lease(bid)
        dead = held[0] if held is not None and _gone(held[0], self.holder) else None
        if self.store.take_lease(bid, self.holder, LEASE_S, dead):
            self._leases[bid] = now + LEASE_S
            return None
        self._leases.pop(bid, None)
        return LEASE_RENEW_S if held is None else max(LEASE_RENEW_S / 10, held[1] - now)

    def _cap(self, model: str) -> int:
        """Lines of batches this model may have in flight now."""
        try:
            handle = self.engine.model(model)
        except ZeroserveError:
            return self.options.lines_per_model  # not served: its lines fail at once
        # Admission's count less the lines it admitted: the model's interactive requests.
        others = handle.statistics().queue.in_flight - self._admitted[model]
        if others > 0:
            return LINES_BESIDE_INTERACTIVE
        return self.options.lines_per_model + self.options.lines_queued

    def _schedule(self, batch: s.BatchObject, pending: int) -> float | None:
        bid = batch.id
        flying = self._flight.setdefault(bid, {})
        now = self._clock()
        soonest: float | None = None
        owner = self.store.owner_of(bid)
        for idx, custom_id, body in self.store.pending(bid, SCHEDULE_WINDOW, set(flying)):
            until = self._held.get((bid, idx))
            if until is not None:
                if until > now:
                    soonest = until - now if soonest is None else min(soonest, until - now)
                    continue
                del self._held[(bid, idx)]
            model = _model_of(body)
            if self._per_model[model] >= self._cap(model):
                continue
            flying[idx] = model
            self._per_model[model] += 1
            task = asyncio.get_running_loop().create_task(
                self._line(bid, owner, batch.endpoint, idx, custom_id, body, model)
            )
            self._lines.add(task)
            task.add_done_callback(self._lines.discard)
        return soonest

    # -- a line --------------------------------------------------------------------------
    async def _line(
        self, bid: str, owner: str, endpoint: str, idx: int, custom_id: str | None,
        body: bytes, model: str,
    ) -> None:  # fmt: skip
        try:
            try:
                status, payload, request_id = await self._call(owner, endpoint, body, model)
            except _Retry as retry:
                self._held[(bid, idx)] = self._clock() + retry.after
                return
            result = s.encoder.encode(
                s.LineResult(
                    id=_request_id(),
                    custom_id=custom_id,
                    response=s.LineResponse(
                        status_code=status, request_id=request_id, body=msgspec.Raw(payload)
                    ),
                )
            )
            if not await self._commit(bid, idx, result, 200 <= status < 300):
                log.warning("batch %s line %d: not committed (done, or the lease lost)", bid, idx)
            self.lines_run += 1
        finally:
            self._flight.get(bid, {}).pop(idx, None)
            self._per_model[model] -= 1
            self.wake()

    async def _commit(self, bid: str, idx: int, result: bytes, ok: bool) -> bool:
        """Commit a line's result; while another process holds the write lock past the
        loop's short busy wait (``store.LOOP_BUSY_S``), retry after a pause on the loop
        rather than inside SQLite, within the lease (a lease lost: not committed)."""
        deadline = self._clock() + LEASE_S
        while True:
            try:
                return self.store.finish_line(bid, idx, result, ok, self.holder)
            except sqlite3.OperationalError:
                if self._clock() >= deadline:
                    raise
                await asyncio.sleep(COMMIT_RETRY_S)

    async def _call(
        self, owner: str, endpoint: str, body: bytes, model: str
    ) -> tuple[int, bytes, str]:
        """Run one line through its route's handler: (status, JSON body, request id)."""
        edge = self.edge
        ctx = edge.start("POST", (), endpoint)
        request_id = ctx.request_id.decode("ascii") or _request_id()
        if edge.keys is not None and owner:
            quota = edge.quota(owner)
            try:
                quota.admit()
            except Overloaded as exc:
                raise _Retry(exc.retry_after) from None
            ctx.key, ctx.quota = quota.key, quota
        route, params = self.router.match("POST", endpoint)
        head = RequestHead(
            method="POST",
            target=endpoint.encode("ascii"),
            path=endpoint,
            query="",
            version="1.1",
            headers=[(b"content-type", b"application/json")],
            content_length=len(body),
            chunked=False,
            keep_alive=True,
            expect_continue=False,
            head_bytes=0,
        )
        req = Request(head, params, route)
        req.pin_priority(BATCH_PRIORITY)  # the lowest class, whatever the line asks
        req.body = memoryview(body)
        req.edge = ctx
        admitted = False
        try:
            if route.on_head is not None:
                route.on_head(req)
            result = route.handler(req)  # admits the line (429 raised here)
            self._admitted[model] += 1
            admitted = True
            if inspect.isawaitable(result):
                result = await result
            if isinstance(result, StreamResponse):  # refused at validation: never here
                await result.pieces.aclose()
                raise ZeroserveError("a batch line cannot stream")
            return result.status, _joined(result), request_id
        except Overloaded as exc:
            raise _Retry(exc.retry_after) from None
        except ZeroserveError as exc:
            return exc.status, error_body(exc, "openai"), request_id
        except Exception:
            log.exception("a batch line failed")
            return 500, error_body(ZeroserveError("internal server error"), "openai"), request_id
        finally:
            if admitted:
                self._admitted[model] -= 1
            req.release()
            edge.release_quota(ctx)

    # -- validating and ending -------------------------------------------------------------
    def _start_validating(self, batch: s.BatchObject) -> None:
        """Validate ``batch`` in a thread (reading, checking and inserting 50,000 lines
        takes about a second of CPU: on the loop it would stall every request)."""
        bid = batch.id
        if bid in self._validating:
            return
        task = asyncio.get_running_loop().create_task(self._validate(batch))
        self._validating[bid] = task
        task.add_done_callback(lambda _: self._validated(bid))

    def _validated(self, bid: str) -> None:
        self._validating.pop(bid, None)
        self.wake()

    async def _validate(self, batch: s.BatchObject) -> None:
        """Check every line of the input file: a bad line fails alone (its error is its
        result); duplicate ``custom_id`` values fail the batch (the output could not
        tell their answers apart)."""
        try:
            await asyncio.to_thread(self.store.start, batch.id, _checked_lines(self.store, batch))
        except _DuplicateId as dup:
            self.store.fail(
                batch.id,
                [
                    s.BatchError(
                        code="duplicate_custom_id",
                        message=f"line {dup.line} repeats an earlier line's custom_id",
                        param="custom_id",
                        line=dup.line,
                    )
                ],
            )
        except Exception:
            log.exception("validating batch %s failed; retrying in a second", batch.id)
            await asyncio.sleep(1.0)  # a back-off, then the next pass validates it again

    def _end(self, batch: s.BatchObject, status: str) -> None:
        """Write the output and error files from the lines' results, then end the batch.
        Lines that never ran (cancelled, expired) go to the error file with why."""
        code = {"cancelled": "batch_cancelled", "expired": "batch_expired"}.get(status, "")
        outputs = {}
        counts = [0, 0]
        for i, (kind, ok) in enumerate((("output", True), ("error", False))):
            fid, part = self.store.part_path()
            n = 0
            with open(part, "wb") as f:
                for _, cid, result in self.store.results(batch.id, ok):
                    if result is None:
                        result = _error_line(
                            cid, code, f"the batch was {status} before this line ran"
                        )
                    f.write(result)
                    f.write(b"\n")
                    n += 1
                f.flush()
                os.fsync(f.fileno())
            counts[i] = n
            if n:
                outputs[kind] = (fid, part, n)
            else:
                part.unlink()
        if not self.store.end(batch.id, status, outputs, (counts[0], counts[1]), self.holder):
            log.warning("batch %s: not ended here (its lease was lost)", batch.id)
        self._flight.pop(batch.id, None)
        self._leases.pop(batch.id, None)


def _gone(holder: str, me: str) -> bool:
    """Whether lease ``holder`` is a process of this host that no longer exists."""
    host, _, rest = holder.partition("/")
    pid = rest.partition("/")[0]
    if holder == me or host != socket.gethostname() or not pid.isdigit():
        return False
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    return False


def _joined(resp: Response) -> bytes:
    try:
        return b"".join(resp.body)
    finally:
        for release in resp.release:
            release()


def _model_of(body: bytes) -> str:
    try:
        model = s.peek_decoder.decode(body).model
    except msgspec.DecodeError:
        return ""
    return model if isinstance(model, str) else ""


class _DuplicateId(Exception):
    def __init__(self, line: int) -> None:
        self.line = line


def _checked_lines(store: BatchStore, batch: s.BatchObject) -> Iterator[NewLine]:
    """The input file's lines, checked (runs in the validating thread); raises
    ``_DuplicateId`` at a repeated ``custom_id``."""
    seen: set[str] = set()
    for number, raw in _file_lines(store.path(batch.input_file_id)):
        line = _check_line(raw, batch.endpoint)
        cid = line.custom_id
        if cid is not None:
            if cid in seen:
                raise _DuplicateId(number)
            seen.add(cid)
        yield line


def _file_lines(path: os.PathLike[str]) -> Iterator[tuple[int, bytes]]:
    """The non-blank lines of a file with their numbers (each is copied into the store
    as it is: read once, line by line, never the whole file)."""
    with open(path, "rb") as f:
        for number, line in enumerate(f, 1):
            if not _BLANK.fullmatch(line):
                yield number, line


def _check_line(raw: bytes, endpoint: str) -> NewLine:
    """A line to run, or a line failed with why (never quoting its text)."""
    try:
        line = s.line_decoder.decode(raw)
    except msgspec.DecodeError:
        return NewLine(
            None, None, _error_line(None, "invalid_line", "the line is not a request object")
        )
    cid = line.custom_id

    def failed(code: str, message: str) -> NewLine:
        return NewLine(cid, None, _error_line(cid, code, message))

    if cid is None:
        return failed("missing_custom_id", "the line has no custom_id")
    if line.method != "POST":
        return failed("invalid_method", "a batch line's method is POST")
    if line.url != endpoint:
        return failed("invalid_url", f"this batch's lines are requests to {endpoint}")
    if not line.body:
        return failed("missing_body", "the line has no body")
    try:
        peek = s.peek_decoder.decode(line.body)
    except msgspec.DecodeError:
        return failed("invalid_body", "the line's body is not a JSON object")
    if peek.stream not in (None, False):
        return failed("invalid_body", "a batch line cannot stream: leave stream out or false")
    return NewLine(cid, bytes(line.body))
