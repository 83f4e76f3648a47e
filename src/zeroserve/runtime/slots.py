"""The slots of a model whose engine schedules its own work (llama.cpp's, in-process).

Strategy (docs/architecture.md, "The llama.cpp backend")
--------------------------------------------------------
Such an engine decodes ``slots`` sequences together (continuous batching). One call (a
chat, a completion, an embedding) blocks its calling thread in C++ for the whole call; a
streaming call hands each chunk to a callback, and the callback's ``True`` stops the slot
at its next token. So a :class:`SlotPool` has exactly ``slots`` threads, one per slot,
and a count of free slots. A request waits for a slot on the event loop, in the order
of its class aged by its wait (a :class:`~.classes.ClassQueue`; first come first served
within a class), holding only its admission ticket (the queue depth bounds the waiters:
429 beyond), never in a thread; the wait is bounded by the request's deadline.

:class:`SlotStream` is one streaming call, a ``PieceStream`` of the engine's chunks
(``bytes``) under the same contract as every other stream (docs/architecture.md,
"Stream classes"): it owns its ticket from the start and releases it once, when the
stream ends, fails or is closed. The engine's thread appends chunks under a lock and
wakes the loop only when the consumer waits. The engine never pauses a slot for a slow
reader, so the chunks pending are bounded in bytes (``byte_cap``, the channels'
coalesce cap): past it the stream fails with ``StreamAborted`` and its slot is stopped.
The deadline (a timer on the injected clock), the consumer's ``aclose()`` and a
cancelled wait set the flag the callback returns; the slot frees when its thread
returns.

:meth:`SlotPool.run` runs calls that cannot be stopped once begun (an embedding call has
no callback), one after another in one slot: a deadline or a cancellation answers at
once and starts no further call; the slot frees when the running call's thread returns.

Invariants
----------
* At most ``slots`` calls run at once; a slot is released exactly once, by the thread's
  completion (or by the consumer when no thread was started).
* A stream's ticket is released exactly once.
"""

from __future__ import annotations

import asyncio
import threading
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TypeVar

from ..errors import DeadlineExceeded, StreamAborted
from .admission import Ticket
from .classes import DEFAULT_AGING_S, ClassQueue, ClassStatistics, Priority
from .clock import Clock, Timer, call_at

T = TypeVar("T")
# The engine's streaming call: it blocks, handing each chunk to the callback; the
# callback's True stops the call at its next token.
ChunkCall = Callable[[bytes, Callable[[bytes], bool]], None]


@dataclass(frozen=True, slots=True)
class SlotStatistics:
    slots: int  # parallel sequences of the engine
    active: int  # slots running a call now
    queued: int  # requests admitted and waiting for a slot
    requests: int  # streams and runs started
    aborted: int  # streams stopped early (disconnect, deadline, slow reader)
    embedded_inputs: int  # inputs the engine computed in whole calls (``run``'s ``items``)


class _SlotQueue:
    """Free slots and the requests waiting for one, by class (runtime/classes.py)."""

    __slots__ = ("free", "waiting")

    def __init__(self, slots: int, clock: Clock, aging_s: float) -> None:
        self.free = slots
        self.waiting: ClassQueue[asyncio.Future[None]] = ClassQueue(clock, aging_s)

    async def acquire(self, clock: Clock, deadline: float, priority: Priority) -> None:
        if self.free > 0 and not self.waiting:
            self.free -= 1
            return
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.waiting.push(fut, priority)

        def expire() -> None:
            if not fut.done():
                fut.set_exception(
                    DeadlineExceeded("the request's deadline passed while it waited for a slot")
                )

        timer = call_at(clock, deadline, expire)
        try:
            await fut
        except BaseException:
            if fut.done() and not fut.cancelled() and fut.exception() is None:
                self.release()  # granted in the same turn as it was cancelled: pass it on
            else:
                fut.cancel()
                self.waiting.remove(fut)  # never granted: it leaves the queue unserved
            raise
        finally:
            timer.cancel()

    def release(self) -> None:
        waiting = self.waiting
        while waiting:
            fut = waiting.peek()
            if fut.done():  # cancelled or expired, its task not yet run: not served
                waiting.remove(fut)
                continue
            waiting.pop().set_result(None)  # the slot passes to the waiter, never via free
            return
        self.free += 1


class SlotPool:
    """One model's engine slots: ``slots`` threads and the requests waiting for them."""

    def __init__(
        self,
        name: str,
        slots: int,
        *,
        byte_cap: int,
        clock: Clock,
        aging_s: float = DEFAULT_AGING_S,
    ) -> None:
        if slots < 1:
            raise ValueError("an engine has at least one slot")
        self.name = name
        self.slots = slots
        self.byte_cap = byte_cap
        self.clock = clock
        self._pool = ThreadPoolExecutor(max_workers=slots, thread_name_prefix=f"slots-{name}")
        self._waiters = _SlotQueue(slots, clock, aging_s)
        self.active = 0
        self.queued = 0
        self.requests = 0
        self.aborted = 0
        self.embedded_inputs = 0

    def statistics(self) -> SlotStatistics:
        return SlotStatistics(
            self.slots, self.active, self.queued, self.requests, self.aborted, self.embedded_inputs
        )

    def class_statistics(self) -> dict[Priority, ClassStatistics]:
        """The slot waits per class (runtime/classes.py)."""
        return self._waiters.waiting.statistics()

    def close(self) -> None:
        """Let the threads go (calls still running finish; none starts)."""
        self._pool.shutdown(wait=False, cancel_futures=True)

    # -- requests --------------------------------------------------------------------------
    def stream(
        self, ticket: Ticket, call: ChunkCall, payload: bytes, *, deadline: float
    ) -> SlotStream:
        """A streaming call of ``call(payload, callback)``, started when the stream is
        first awaited. The stream owns ``ticket`` from now on."""
        self.requests += 1
        return SlotStream(self, ticket, call, payload, deadline)

    async def run(
        self,
        ticket: Ticket,
        calls: Sequence[Callable[[], T]],
        *,
        deadline: float,
        items: Sequence[int] = (),
    ) -> list[T]:
        """Run ``calls`` one after another in one slot and return their results; takes
        ``ticket`` and releases it. ``items[i]``: the inputs call ``i`` computes (counted
        once it returned). A call's exception ends the run with it; a deadline or a
        cancellation ends it at once, and the call running keeps the slot until its
        thread returns."""
        self.requests += 1
        results: list[T] = []
        try:
            await self._acquire(deadline, ticket)
            loop = asyncio.get_running_loop()
            expired: asyncio.Future[None] = loop.create_future()
            timer = call_at(self.clock, deadline, lambda: _settle(expired))
            running: asyncio.Future[T] | None = None
            try:
                for i, call in enumerate(calls):
                    running = loop.run_in_executor(self._pool, call)
                    running.add_done_callback(self._counted(items[i] if i < len(items) else 0))
                    # Not cancelled by a cancellation of this task (asyncio.wait leaves
                    # the futures it waits on alone): the call cannot be stopped.
                    await asyncio.wait((running, expired), return_when=asyncio.FIRST_COMPLETED)
                    if not running.done():
                        raise DeadlineExceeded("the request's deadline passed during the call")
                    results.append(running.result())
                    running = None
            finally:
                timer.cancel()
                if running is not None and not running.done():
                    running.add_done_callback(lambda _: self._release())
                else:
                    self._release()
        finally:
            ticket.release()
        return results

    def _counted(self, n: int) -> Callable[[asyncio.Future[T]], None]:
        """A done callback: ``n`` inputs computed, if the call succeeded (its exception
        is retrieved here, so one raised after the request gave up is not reported as
        never retrieved)."""

        def done(fut: asyncio.Future[T]) -> None:
            if not fut.cancelled() and fut.exception() is None:
                self.embedded_inputs += n

        return done

    # -- slots -----------------------------------------------------------------------------
    async def _acquire(self, deadline: float, ticket: Ticket) -> None:
        watch = ticket.watch
        if watch is not None:
            watch.queued()
        self.queued += 1
        try:
            await self._waiters.acquire(self.clock, deadline, ticket.priority)
        finally:
            self.queued -= 1
        self.active += 1
        if watch is not None:
            watch.started()

    def _release(self) -> None:
        self.active -= 1
        self._waiters.release()

    def _submit(self, fn: Callable[[], None]) -> asyncio.Future[None]:
        return asyncio.get_running_loop().run_in_executor(self._pool, fn)


def _settle(fut: asyncio.Future[None]) -> None:
    if not fut.done():
        fut.set_result(None)


class SlotStream:
    """One streaming engine call: the chunks it makes, read on the loop (a
    ``PieceStream`` of ``bytes``). It owns its ticket and releases it once."""

    def __init__(
        self, pool: SlotPool, ticket: Ticket, call: ChunkCall, payload: bytes, deadline: float
    ) -> None:
        self.pool = pool
        self.deadline = deadline
        self._ticket: Ticket | None = ticket
        self._call = call
        self._payload: bytes | None = payload
        self._lock = threading.Lock()
        self._pending: deque[bytes] = deque()
        self._pending_bytes = 0
        self.peak_pending_bytes = 0
        self._waiter: asyncio.Future[None] | None = None
        self._waiting = False
        self._done = False  # the engine call returned
        self._error: BaseException | None = None
        self.cancelled = False  # read by the engine's thread at every chunk
        self.complete = False  # the consumer read the whole stream
        self._started = False
        self._slot = False  # this stream holds a slot
        self._thread: asyncio.Future[None] | None = None
        self._timer: Timer | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._finished = False

    # -- the engine's thread ---------------------------------------------------------------
    def _callback(self, chunk: bytes) -> bool:
        if self.cancelled:
            return True
        cap = self.pool.byte_cap
        with self._lock:
            self._pending.append(chunk)
            self._pending_bytes += len(chunk)
            if self._pending_bytes > self.peak_pending_bytes:
                self.peak_pending_bytes = self._pending_bytes
            over = self._pending_bytes > cap
            if over:  # the reader is too far behind: what is pending is dropped
                self.cancelled = True
                self._pending.clear()
                self._pending_bytes = 0
                if self._error is None:
                    self._error = StreamAborted(
                        f"stream aborted: the client fell more than {cap} bytes behind"
                    )
            wake, self._waiting = self._waiting, False
        if wake:
            loop = self._loop
            assert loop is not None
            loop.call_soon_threadsafe(self._wake)
        return over

    def _run(self) -> None:
        payload, self._payload = self._payload, None
        assert payload is not None
        try:
            self._call(payload, self._callback)
        except BaseException as exc:
            with self._lock:
                if self._error is None:
                    self._error = exc
        finally:
            with self._lock:
                self._done = True
                wake, self._waiting = self._waiting, False
            loop = self._loop
            if wake and loop is not None:
                loop.call_soon_threadsafe(self._wake)

    # -- the loop --------------------------------------------------------------------------
    def __aiter__(self) -> SlotStream:
        return self

    async def __anext__(self) -> bytes:
        try:
            if not self._started:
                await self._start()
            chunk = await self._next()
        except BaseException:  # an error, the deadline, or the consumer cancelled
            self._close()
            raise
        if chunk is None:
            self.complete = True
            self._close()
            raise StopAsyncIteration
        return chunk

    async def _start(self) -> None:
        self._started = True
        ticket = self._ticket
        assert ticket is not None, "the stream was closed before it started"
        pool = self.pool
        await pool._acquire(self.deadline, ticket)
        self._slot = True
        self._loop = asyncio.get_running_loop()
        self._timer = call_at(pool.clock, self.deadline, self._expire)
        self._thread = pool._submit(self._run)
        self._thread.add_done_callback(self._thread_done)

    async def _next(self) -> bytes | None:
        while True:
            with self._lock:
                if self._pending:
                    chunk = self._pending.popleft()
                    self._pending_bytes -= len(chunk)
                    return chunk
                if self._error is not None:
                    raise self._error
                if self._done:
                    return None
                self._waiting = True
                waiter = self._waiter = asyncio.get_running_loop().create_future()
            try:
                await waiter
            finally:
                self._waiter = None

    def receive_batch_nowait(self, max_items: int) -> list[bytes]:
        """Chunks here now, up to ``max_items`` (possibly none); the end and errors are
        left for ``__anext__``."""
        out: list[bytes] = []
        if not self._started:
            return out
        with self._lock:
            pending = self._pending
            while pending and len(out) < max_items:
                chunk = pending.popleft()
                self._pending_bytes -= len(chunk)
                out.append(chunk)
        return out

    async def aclose(self) -> None:
        """Stop the call at its next token if it still runs, and release the ticket."""
        self._close()

    @property
    def finish_reason(self) -> str | None:
        return None  # the engine's chunks carry it

    def _wake(self) -> None:
        w = self._waiter
        if w is not None and not w.done():
            w.set_result(None)

    def _fail(self, exc: BaseException) -> None:
        with self._lock:
            self._pending.clear()
            self._pending_bytes = 0
            if self._error is None:
                self._error = exc
        self._wake()

    def _expire(self) -> None:
        self.cancelled = True
        self._fail(DeadlineExceeded("the request's deadline passed during generation"))

    def _thread_done(self, fut: asyncio.Future[None]) -> None:
        if self._slot:
            self._slot = False
            self.pool._release()

    def _close(self) -> None:
        if self._finished:
            return
        self._finished = True
        with self._lock:
            running = self._started and not self._done
        if running:
            self.cancelled = True
            if not self.complete:
                self.pool.aborted += 1
        if self._timer is not None:
            self._timer.cancel()
        if self._thread is None and self._slot:  # a slot taken, no thread started
            self._slot = False
            self.pool._release()
        ticket, self._ticket = self._ticket, None
        if ticket is not None:
            ticket.release()
