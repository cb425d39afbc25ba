"""Admission control for one model: in-flight bound, bounded queue fair across clients, deadlines, cancellation.

    arrive -> [closed?      503 Unavailable]
           -> [deadline passed?  504]
           -> slot free and nobody queued?  run now
           -> queue full?   429 Overloaded, unless another client holds at least two more
                            waiting requests than this one's: then its newest gets the 429
                            instead and this one is queued (runtime/fair_queue.py). At once,
                            unless this client already has requests waiting, or its address was
                            refused FLOOD_REFUSALS times within the last `refusal_hold_s` (one
                            host sending many client ids: RecentRefusals): then its 429 is held
                            back for `refusal_hold_s` (a greedy client's refusals, answered at
                            once, came back as its next requests and kept the event loop busy
                            for every other client: docs/serving.md, starvation)
           -> wait until a slot is handed over, or the deadline passes (504, never run), or the
              client goes away (its queue place is freed); slots go to the clients in turn, each
              client's requests first in first out (runtime/fair_queue.py)
    run    -> on a worker thread (one per slot, so an admitted request starts at once);
              just before the engine is called the deadline is checked again: a request whose
              remaining time is shorter than the model's recent compute time (a moving average)
              while others wait for a slot cannot make it and gets 504 without running, leaving
              the slot to one that can (with nobody waiting it runs: a refused request teaches
              the average nothing, and one slow call must not refuse every later request);
              an answer ready after the deadline is dropped with 504.

A client that goes away sets the request's `cancelled` event: a request not yet on a worker
thread is not started, and the event is meant to be handed to the engine call too (served.py),
so that a request still waiting inside the engine (a batcher's queue, a request context)
returns at once, unrun (`boundgen.errors.Cancelled`), and frees its slot. Otherwise a slot is
held until the engine call returns, even when the client has gone: running engine work cannot
be interrupted, and releasing early would let the next request wait, unseen and without a
deadline, inside the thread pool. Time is `time.monotonic()` seconds throughout.
All methods except the worker-thread body run on the event loop thread.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from typing import Callable, TypeVar

from boundgen.errors import Cancelled
from boundgen.runtime.fair_queue import FairQueue
from boundgen.server.status import DeadlineExceeded, Overloaded, Unavailable

T = TypeVar("T")
ESTIMATE_WEIGHT = 0.2  # of the newest engine call in the moving average of compute time


FLOOD_REFUSALS = 8  # refusals of one address within the hold's window after which its refusals are held
MAX_SOURCES = 4096  # addresses RecentRefusals remembers before it forgets the quiet ones


def refusal_hold(hold_s: float, client_waiting: int, deadline: float | None, flooding: bool = False) -> float:
    """Seconds a full queue's 429 is held back: `hold_s` for a client that already has requests
    waiting, or whose address is `flooding` (RecentRefusals), never past the request's deadline; 0
    for any other (here and the engine process's server/deploy/engine_host.py)."""
    if not (hold_s and (client_waiting or flooding)):
        return 0.0
    return hold_s if deadline is None else max(0.0, min(hold_s, deadline - time.monotonic()))


class RecentRefusals:
    """Full-queue refusals by address over the last `window_s`: `note(source)` counts one and says
    whether the address has had FLOOD_REFUSALS of them in the window. A client id is the client's
    claim (server/request_ids.py), so a host that sends each request under a new id has nothing
    waiting under any of them, and its refusals, answered at once, come straight back as its next
    requests: counted by address, they are held back too. Unknown addresses ("") are not counted.
    Thread-safe (the engine process notes from each front end's reader thread)."""

    def __init__(self, window_s: float, clock: Callable[[], float] = time.monotonic):
        self.window_s, self._clock = window_s, clock
        self._times: dict[str, deque] = {}
        self._lock = threading.Lock()

    def note(self, source: str) -> bool:
        if not (source and self.window_s > 0):
            return False
        now = self._clock()
        with self._lock:
            if source not in self._times and len(self._times) >= MAX_SOURCES:
                self._forget_quiet(now)
            times = self._times.setdefault(source, deque(maxlen=FLOOD_REFUSALS))
            times.append(now)
            return len(times) == FLOOD_REFUSALS and now - times[0] <= self.window_s

    def _forget_quiet(self, now: float) -> None:
        quiet = [s for s, times in self._times.items() if now - times[-1] > self.window_s]
        for source in quiet or list(self._times)[:MAX_SOURCES // 2]:  # all busy: the oldest half
            del self._times[source]


class Admission:
    def __init__(self, model: str, max_inflight: int, max_queue: int,
                 on_queue_wait: Callable[[float], None] = lambda s: None,
                 on_compute: Callable[[float], None] = lambda s: None, refusal_hold_s: float = 0.0):
        if max_inflight < 1 or max_queue < 0:
            raise ValueError(f"model {model}: need max_inflight >= 1 and max_queue >= 0, "
                             f"got {max_inflight} and {max_queue}")
        self.model, self.max_inflight, self.max_queue = model, max_inflight, max_queue
        self.refusal_hold_s = refusal_hold_s
        self._refusals = RecentRefusals(refusal_hold_s)
        self._on_queue_wait, self._on_compute = on_queue_wait, on_compute
        self._pool = ThreadPoolExecutor(max_inflight, thread_name_prefix=f"boundgen-{model}")
        self._inflight = 0
        self._waiters: FairQueue[asyncio.Future] = FairQueue()  # by client
        self._closed = False
        self._closing = asyncio.Event()  # ends the refusals held back (close)
        self._idle: asyncio.Event | None = None
        self._compute_estimate = 0.0  # seconds: moving average of successful engine calls

    @property
    def inflight(self) -> int:
        return self._inflight

    @property
    def queued(self) -> int:
        return len(self._waiters)

    async def run(self, fn: Callable[[], T], deadline: float, cancelled: threading.Event | None = None,
                  client: str = "", source: str = "") -> T:
        """Run `fn()` on a worker thread once admitted; raises Unavailable, Overloaded or DeadlineExceeded.
        `cancelled` is set if the caller is cancelled (the client went away) once admitted; pass
        the one `fn` hands to the engine. `client`: who sent it (its turn in the queue); `source`:
        its address (RecentRefusals)."""
        await self._acquire(deadline, client, source)
        cancelled = threading.Event() if cancelled is None else cancelled
        try:
            future = asyncio.get_running_loop().run_in_executor(self._pool, self._compute, fn, deadline, cancelled)
        except BaseException:
            self._release()
            raise
        future.add_done_callback(self._computed)
        try:
            result = await asyncio.shield(future)
        except asyncio.CancelledError:
            # Not started: it will not start. Waiting inside the engine: it will not run.
            # Running: it runs to the end and its answer is dropped.
            cancelled.set()
            raise
        late = time.monotonic() - deadline
        if late > 0:
            raise DeadlineExceeded(f"model {self.model} finished {late * 1e3:.1f} ms after the request's deadline; "
                                   "the answer was dropped")
        return result

    def close(self) -> None:
        """Stop admitting: new requests get 503; queued and running ones finish; refusals held
        back are answered now."""
        self._closed = True
        self._closing.set()

    async def wait_idle(self) -> None:
        """Return once nothing is running or queued."""
        if self._inflight == 0 and not self._waiters:
            return
        self._idle = self._idle or asyncio.Event()
        await self._idle.wait()

    def shutdown(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)

    # ---- internals ------------------------------------------------------------------------

    async def _acquire(self, deadline: float, client: str, source: str = "") -> None:
        if self._closed:
            raise Unavailable(f"model {self.model} is shutting down and admits no new requests")
        arrived = time.monotonic()
        if arrived >= deadline:
            raise DeadlineExceeded("the request's deadline had already passed when it arrived")
        if self._inflight < self.max_inflight and not self._waiters:
            self._inflight += 1
            self._on_queue_wait(0.0)
            return
        if len(self._waiters) >= self.max_queue:
            try:
                self._make_room(client)
            except Overloaded:
                hold = refusal_hold(self.refusal_hold_s, self._waiters.waiting(client), deadline,
                                    self._refusals.note(source))
                if hold:
                    try:  # held back, unless the server closes first (a drain waits for no refusal)
                        await asyncio.wait_for(self._closing.wait(), hold)
                    except asyncio.TimeoutError:
                        pass
                raise
        waiter = asyncio.get_running_loop().create_future()
        self._waiters.append(client, waiter)
        try:
            await asyncio.wait_for(waiter, deadline - time.monotonic())  # cancels `waiter` on timeout
        except BaseException as exc:
            if waiter.done() and not waiter.cancelled() and waiter.exception() is None:
                self._release()  # the slot was handed over just as we gave up: pass it on
            elif not waiter.done() or waiter.cancelled():
                waiter.cancel()
                self._remove(client, waiter)
            # else: displaced (_make_room), already out of the queue
            self._on_queue_wait(time.monotonic() - arrived)
            if isinstance(exc, asyncio.TimeoutError):  # builtin TimeoutError from 3.11 on
                raise DeadlineExceeded(f"the deadline passed after {(time.monotonic() - arrived) * 1e3:.1f} ms "
                                       f"queued for model {self.model}; the request was not run") from None
            raise
        self._on_queue_wait(time.monotonic() - arrived)

    def _compute(self, fn: Callable[[], T], deadline: float, cancelled: threading.Event) -> T:
        """Worker thread: the last check before the engine, then the engine call."""
        if cancelled.is_set():
            raise Cancelled(f"the client went away before model {self.model} was called; the request was not run")
        start = time.monotonic()
        left, needs = deadline - start, self._compute_estimate
        if left <= 0:
            raise DeadlineExceeded(f"the deadline passed {-left * 1e3:.1f} ms before model {self.model} "
                                   "could start; the request was not run")
        if left < needs and self._waiters:  # `len` of the queue, read off the loop: a benign race
            raise DeadlineExceeded(f"{left * 1e3:.1f} ms were left before the deadline and model {self.model} "
                                   f"needs about {needs * 1e3:.1f} ms; the request was not run")
        try:
            result = fn()
        finally:
            seconds = time.monotonic() - start
            self._on_compute(seconds)
        # A benign race between worker threads: each update is a plain float store, from the estimate as it
        # is now (not `needs`, read before the call: calls that ran side by side each moved it once).
        now = self._compute_estimate
        self._compute_estimate = seconds if not now else now + ESTIMATE_WEIGHT * (seconds - now)
        return result

    def _computed(self, future: asyncio.Future) -> None:
        if not future.cancelled():
            future.exception()  # retrieved here, in case the client is gone and nobody awaits it
        self._release()

    def _make_room(self, client: str) -> None:
        """The queue is full: refuse the newest request of a client holding more than its share in
        favour of `client`'s (it gets the 429 this one would have), else raise Overloaded."""
        at_capacity = (f"model {self.model} is at capacity ({self._inflight} requests running, "
                       f"{len(self._waiters)} queued; limits {self.max_inflight} and {self.max_queue}); ")
        displaced = self._waiters.displaceable(client)
        if displaced is None:
            raise Overloaded(at_capacity + "retry later")
        greedy, waiter = displaced
        self._waiters.remove(greedy, waiter)
        waiter.set_exception(Overloaded(at_capacity + "this client's newest queued request gave its place to "
                                        "another client's; retry later"))

    def _release(self) -> None:
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)  # the slot passes to the next client in turn
                return
        self._inflight -= 1
        self._check_idle()

    def _remove(self, client: str, waiter: asyncio.Future) -> None:
        self._waiters.remove(client, waiter)
        self._check_idle()

    def _check_idle(self) -> None:
        if self._idle is not None and self._inflight == 0 and not self._waiters:
            self._idle.set()


class Passage:
    """Admission for an engine whose queue is elsewhere (a front-end process: the engine process
    admits, with one queue per model for every front end, server/deploy/engine_host.py). Here it
    only refuses new requests once closed (503) and counts what is in flight, for drain and metrics."""

    def __init__(self, model: str, max_queue: int):
        self.model, self.max_queue = model, max_queue
        self.max_inflight = 0  # bounded by the engine process, not here
        self._inflight = 0
        self._closed = False
        self._idle: asyncio.Event | None = None

    @property
    def inflight(self) -> int:
        return self._inflight

    @property
    def queued(self) -> int:
        return 0

    async def run_async(self, make, deadline: float):
        """Await `make()` (a coroutine) once admitted: Unavailable once closed, DeadlineExceeded
        if the deadline has already passed."""
        if self._closed:
            raise Unavailable(f"model {self.model} is shutting down and admits no new requests")
        if time.monotonic() >= deadline:
            raise DeadlineExceeded("the request's deadline had already passed when it arrived")
        self._inflight += 1
        try:
            return await make()
        finally:
            self._inflight -= 1
            if self._idle is not None and self._inflight == 0:
                self._idle.set()

    def close(self) -> None:
        self._closed = True

    async def wait_idle(self) -> None:
        if self._inflight == 0:
            return
        self._idle = self._idle or asyncio.Event()
        self._idle.clear()
        await self._idle.wait()

    def shutdown(self) -> None:
        pass
