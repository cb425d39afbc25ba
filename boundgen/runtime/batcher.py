"""Batching concurrent requests into one model call.

One H200 is not filled by one small request (../docs/architecture.md): a 15-sample score
request is ~2,000 tokens, and every call reads all weights once. The batcher lets requests
that arrive while the GPU is busy share the next call. It never waits for company: a worker
that becomes free takes the next waiting request plus every other waiting request that
still fits the call's bounds, in queue order, so an idle server adds no latency. Queue order is
fair across clients (runtime/fair_queue.py: round-robin over the clients with requests waiting,
each client's in arrival order); requests that name no client are one client, in arrival order.
A queue bound (`enqueue`'s `max_queue`, the engine process's --max-queue) refuses a request
(`Overloaded`) when the queue is full, unless a client holding at least two more waiting
requests gives its newest up (it fails with `Overloaded`, not run) to make room.

Deadlines (`time.monotonic()` seconds, optional per request): a request never runs after its
deadline. A worker taking a batch first fails every waiting request whose deadline has passed
(`DeadlineExceeded`, not run), so expired requests take no room in the call; and a caller
whose deadline passes while its request still waits takes it back out of the queue at once,
rather than waiting for a worker to become free. A request already taken runs to the end.

Cancellation (a `threading.Event`, optional per request, set by the caller's caller when its
client goes away) is handled the same way: a worker fails every waiting request whose event is
set (`Cancelled`, not run) before it takes a batch, and a waiting caller looks at its event every
CANCEL_POLL_S (runtime/waiting.py) and takes its request back out of the queue once it is set.

Waiting for company (`linger_s`, 0 by default: never): a call of one request costs nearly as much
as a call of several (a W2 beam call of 1 request 6.6 ms, of 2 7.3 ms, of 4 9.2 ms on the H200), and
clients whose requests just came back send their next ones a moment later (a closed loop, a user's
session). So when a call ends, the batcher expects as many requests as that call held plus those
already waiting then (in a closed loop of c clients: all c). A free worker less than `linger_s` after
the last call's end that finds fewer waiting, and not enough to fill a call, waits until the expected
number wait, a call's worth, or `linger_s` after that end, whichever is first; then it takes them as
above. A request waits at most `linger_s` for company, and only right after a call: one arriving at
an engine idle for that long starts at once, and a lone client (a call of one, nobody waiting) never
waits. With `learn_linger` the wait follows how long the company took to come back after recent
calls, never shorter than `linger_s` (runtime/company.py says how and why).

Workers are threads, one per request context; `run_batch(ctx, items)` does the work and
returns one result per item, or an exception in an item's place (that item's error: a constrained
request whose allow-list proved bad once its call ran), or raises, failing every item of that batch.
"""

from __future__ import annotations

import threading
import time
from concurrent.futures import Future, wait
from dataclasses import dataclass, field
from typing import Callable, Hashable, Sequence

from boundgen.errors import Cancelled, DeadlineExceeded, EngineClosed, Overloaded
from boundgen.runtime.company import CompanyWait
from boundgen.runtime.fair_queue import FairQueue
from boundgen.runtime.waiting import checked, refusal, wait_slice


@dataclass(eq=False)  # compared by identity: the queue removes this very entry
class Ticket:
    """A queued request: what the batcher's caller holds to learn its result or withdraw it."""

    item: object
    deadline: float | None
    submitted: float
    cancelled: threading.Event | None = None
    client: Hashable = ""  # who sent it: its turn in the queue (runtime/fair_queue.py)
    future: Future = field(default_factory=Future)

    def gone(self, now: float) -> str | None:
        """Why this request must not run any more ("cancelled", "expired"), or None."""
        return refusal(now, self.deadline, self.cancelled)


class Batcher:
    def __init__(self, contexts: Sequence, run_batch: Callable, fits: Callable[[list, object], bool],
                 name: str = "batcher", clock: Callable[[], float] = time.monotonic, linger_s: float = 0.0,
                 learn_linger: bool = False):
        """`name`: the model, in thread names and error messages; `clock`: what deadlines are
        compared with (time.monotonic; tests pass their own); `linger_s`: how long after a call a
        worker may wait for company (above; 0: never); `learn_linger`: longer where the company
        takes longer to come back (runtime/company.py)."""
        self._run_batch, self._fits, self._name, self._clock = run_batch, fits, name, clock
        self._company = CompanyWait(linger_s, learned=learn_linger)
        self._last_call = (float("-inf"), 0)  # (when the last call ended, requests expected after it)
        self._waiting: FairQueue[Ticket] = FairQueue()
        self._cond = threading.Condition()
        self._closed = False
        self.batches = 0  # calls made
        self.items = 0  # requests served
        self.expired = 0  # requests failed for their deadline, never run
        self.cancelled = 0  # requests failed because their caller cancelled them, never run
        self._threads = [threading.Thread(target=self._work, args=(ctx,), name=f"{name}-batch-{i}", daemon=True)
                         for i, ctx in enumerate(contexts)]
        for t in self._threads:
            t.start()

    @property
    def queued(self) -> int:
        """Requests waiting for a call now (the one queue's length: admission's bound)."""
        return len(self._waiting)

    def enqueue(self, item, deadline: float | None = None, cancelled: threading.Event | None = None,
                client: Hashable = "", max_queue: int | None = None) -> "Ticket":
        """Queue `item` for some call without waiting: its ticket's `future` gets the result (or the
        error). Raises DeadlineExceeded or Cancelled, without queueing it, if it is already gone,
        and Overloaded if `max_queue` requests wait and no other client gives a place up (module
        docstring); `withdraw(ticket)` takes it back out while it still waits. `client`: who sent it."""
        deadline, cancelled = checked(deadline, cancelled)
        entry = Ticket(item, deadline, self._clock(), cancelled, client)
        gone = entry.gone(entry.submitted)
        if gone == "cancelled":
            raise Cancelled(f"the request was cancelled before it reached model {self._name}; it was not run")
        if gone == "expired":
            raise DeadlineExceeded(f"the deadline passed {(entry.submitted - deadline) * 1e3:.1f} ms before the "
                                   f"request reached model {self._name}; the request was not run")
        displaced = None
        with self._cond:
            if self._closed:
                raise EngineClosed("the engine is closed")
            if max_queue is not None and len(self._waiting) >= max_queue:
                displaced = self._waiting.displaceable(client)
                if displaced is None:
                    refused = Overloaded(f"model {self._name} is at capacity ({len(self._waiting)} requests queued; "
                                         f"limit {max_queue}); retry later")
                    refused.client_waiting = self._waiting.waiting(client)
                    raise refused
                self._waiting.remove(*displaced)
            self._waiting.append(client, entry)
            self._company.arrived(entry.submitted)
            self._cond.notify()
        if displaced is not None:
            displaced[1].future.set_exception(Overloaded(
                f"model {self._name} is at capacity ({max_queue} requests queued); this client's newest queued "
                "request gave its place to another client's; retry later"))
        return entry

    def withdraw(self, entry: "Ticket") -> bool:
        """Take a waiting request back out of the queue and fail its future (DeadlineExceeded if its
        deadline has passed, else Cancelled); False if a worker already took it (it runs to the end)."""
        now = self._clock()
        gone = entry.gone(now) or "cancelled"
        with self._cond:
            queued = self._waiting.remove(entry.client, entry)
            if queued:
                self._count(gone)
        if queued and not entry.future.done():
            entry.future.set_exception(self._error(entry, gone, now))
        return queued

    def submit(self, item, deadline: float | None = None, cancelled: threading.Event | None = None):
        """Run `item` in some batch; block until its result is ready and return it (or raise).
        Raises DeadlineExceeded, without running `item`, if `deadline` passes before a worker takes
        it, and Cancelled if `cancelled` is set before then."""
        entry = self.enqueue(item, deadline, cancelled)
        while not self._wait(entry):
            if entry.gone(self._clock()) is None:
                continue  # a cancellation poll: still wanted, still waiting
            self.withdraw(entry)  # taken just in time, it runs; else it fails here with why
            break
        return entry.future.result()

    def _wait(self, entry: Ticket) -> bool:
        """Wait for the entry's result until its deadline or the next look at its cancelled event;
        True if the result is ready."""
        return bool(wait([entry.future], wait_slice(self._clock(), entry.deadline, entry.cancelled)).done)

    def _take(self) -> tuple[list[Ticket], list[tuple[Ticket, str]], float] | None:
        """The next batch, the waiting requests dropped (cancelled or expired) with why, and when
        they were dropped; None once closed and drained."""
        with self._cond:
            while True:
                while not self._waiting and not self._closed:
                    self._cond.wait()
                if not self._waiting:
                    return None
                pause = self._company_expected()
                if pause <= 0:
                    break
                self._cond.wait(pause)  # woken by each arrival
            now = self._clock()
            live, dropped = FairQueue(), []
            for entry in self._waiting:  # in queue order: the clients' turns stay as they were
                gone = entry.gone(now)
                if gone is None:
                    live.append(entry.client, entry)
                else:
                    dropped.append((entry, gone))
                    self._count(gone)
            self._waiting = live
            batch, items = [], []
            while self._waiting and (not batch or self._fits(items, self._waiting.peek().item)):
                entry = self._waiting.popleft()
                batch.append(entry)
                items.append(entry.item)
            return batch, dropped, now

    def _company_expected(self) -> float:
        """Seconds left to wait for company (0: take the batch now); called holding the lock."""
        ended, expected = self._last_call
        linger = self._company.seconds()
        if not linger or self._closed or len(self._waiting) >= expected or self._call_is_full():
            return 0.0
        return ended + linger - self._clock()

    def _call_is_full(self) -> bool:
        """Whether the waiting requests already fill a call (one more would not fit)."""
        items = []
        for entry in self._waiting:
            if items and not self._fits(items, entry.item):
                return True
            items.append(entry.item)
        return False

    def _work(self, ctx):
        while True:
            taken = self._take()
            if taken is None:
                return
            batch, dropped, now = taken
            for entry, gone in dropped:
                entry.future.set_exception(self._error(entry, gone, now))
            if not batch:
                continue
            started = self._clock()
            try:
                results = self._run_batch(ctx, [entry.item for entry in batch])
            except BaseException as exc:  # every request of the batch learns why
                for entry in batch:
                    entry.future.set_exception(exc)
                continue
            with self._cond:
                self.batches += 1
                self.items += len(batch)
                ended = self._clock()
                self._last_call = (ended, len(batch) + len(self._waiting))
                self._company.call_ended(ended, len(batch), ended - started)
            for entry, result in zip(batch, results):  # a request's result, or why it has none
                if isinstance(result, BaseException):
                    entry.future.set_exception(result)
                else:
                    entry.future.set_result(result)

    def _count(self, gone: str) -> None:
        if gone == "cancelled":
            self.cancelled += 1
        else:
            self.expired += 1

    def _error(self, entry: Ticket, gone: str, now: float) -> Exception:
        waited = f"{(now - entry.submitted) * 1e3:.1f} ms waiting for model {self._name} (its calls were busy)"
        if gone == "cancelled":
            return Cancelled(f"the request was cancelled after {waited}; it was not run")
        return DeadlineExceeded(f"the deadline passed after {waited}; the request was not run")

    def close(self):
        """Stop the workers (each finishes its call). Once they have, let go of the engine's
        callables: the engine holds this batcher and they hold the engine, a cycle that only a
        full garbage collection would free, with the engine's device memory (a replaced engine's,
        after a repository load)."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        for t in self._threads:
            t.join(timeout=5)
        if not any(t.is_alive() for t in self._threads):
            self._run_batch = self._fits = None
