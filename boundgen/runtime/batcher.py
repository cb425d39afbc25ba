"""Batching concurrent requests into one model call.

One H200 is not filled by one small request (../docs/architecture.md): a 15-sample score
request is ~2,000 tokens, and every call reads all weights once. The batcher lets requests
that arrive while the GPU is busy share the next call. It never waits for company: a worker
that becomes free takes the oldest waiting request plus every other waiting request that
still fits the call's bounds, in arrival order, so an idle server adds no latency.

Deadlines (`time.monotonic()` seconds, optional per request): a request never runs after its
deadline. A worker taking a batch first fails every waiting request whose deadline has passed
(`DeadlineExceeded`, not run), so expired requests take no room in the call; and a caller
whose deadline passes while its request still waits takes it back out of the queue at once,
rather than waiting for a worker to become free. A request already taken runs to the end.

Workers are threads, one per request context; `run_batch(ctx, items)` does the work and
returns one result per item (or raises, failing every item of that batch).
"""

from __future__ import annotations

import collections
import threading
import time
from concurrent.futures import Future, wait
from dataclasses import dataclass, field
from typing import Callable, Sequence

from boundgen.errors import DeadlineExceeded


@dataclass(eq=False)  # compared by identity: the queue removes this very entry
class _Entry:
    item: object
    deadline: float | None
    submitted: float
    future: Future = field(default_factory=Future)

    def expired(self, now: float) -> bool:
        return self.deadline is not None and now >= self.deadline


class Batcher:
    def __init__(self, contexts: Sequence, run_batch: Callable, fits: Callable[[list, object], bool],
                 name: str = "batcher", clock: Callable[[], float] = time.monotonic):
        """`name`: the model, in thread names and error messages; `clock`: what deadlines are
        compared with (time.monotonic; tests pass their own)."""
        self._run_batch, self._fits, self._name, self._clock = run_batch, fits, name, clock
        self._waiting: collections.deque[_Entry] = collections.deque()
        self._cond = threading.Condition()
        self._closed = False
        self.batches = 0  # calls made
        self.items = 0  # requests served
        self.expired = 0  # requests failed for their deadline, never run
        self._threads = [threading.Thread(target=self._work, args=(ctx,), name=f"{name}-batch-{i}", daemon=True)
                         for i, ctx in enumerate(contexts)]
        for t in self._threads:
            t.start()

    def submit(self, item, deadline: float | None = None):
        """Run `item` in some batch; block until its result is ready and return it (or raise).
        Raises DeadlineExceeded, without running `item`, if `deadline` passes before a worker takes it."""
        entry = _Entry(item, deadline, self._clock())
        if entry.expired(entry.submitted):
            raise DeadlineExceeded(f"the deadline passed {(entry.submitted - deadline) * 1e3:.1f} ms before the "
                                   f"request reached model {self._name}; the request was not run")
        with self._cond:
            if self._closed:
                raise RuntimeError("the engine is closed")
            self._waiting.append(entry)
            self._cond.notify()
        if deadline is not None and not wait([entry.future], max(0.0, deadline - entry.submitted)).done:
            with self._cond:
                queued = entry in self._waiting
                if queued:
                    self._waiting.remove(entry)
                    self.expired += 1
            if queued:
                raise self._deadline_error(entry, self._clock())
            # Taken just in time (it runs), or failed by the worker's own deadline check: wait for it.
        return entry.future.result()

    def _take(self) -> tuple[list[_Entry], list[_Entry]] | None:
        """The next batch and the waiting requests that expired, or None once closed and drained."""
        with self._cond:
            while not self._waiting and not self._closed:
                self._cond.wait()
            if not self._waiting:
                return None
            now = self._clock()
            expired = [e for e in self._waiting if e.expired(now)]
            if expired:
                self._waiting = collections.deque(e for e in self._waiting if not e.expired(now))
                self.expired += len(expired)
            batch, items = [], []
            while self._waiting and (not batch or self._fits(items, self._waiting[0].item)):
                entry = self._waiting.popleft()
                batch.append(entry)
                items.append(entry.item)
            return batch, expired

    def _work(self, ctx):
        while True:
            taken = self._take()
            if taken is None:
                return
            batch, expired = taken
            now = self._clock()
            for entry in expired:
                entry.future.set_exception(self._deadline_error(entry, now))
            if not batch:
                continue
            try:
                results = self._run_batch(ctx, [entry.item for entry in batch])
            except BaseException as exc:  # every request of the batch learns why
                for entry in batch:
                    entry.future.set_exception(exc)
                continue
            self.batches += 1
            self.items += len(batch)
            for entry, result in zip(batch, results):
                entry.future.set_result(result)

    def _deadline_error(self, entry: _Entry, now: float) -> DeadlineExceeded:
        return DeadlineExceeded(f"the deadline passed after {(now - entry.submitted) * 1e3:.1f} ms waiting for "
                                f"model {self._name} (its calls were busy); the request was not run")

    def close(self):
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        for t in self._threads:
            t.join(timeout=5)
