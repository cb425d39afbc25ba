"""Batching concurrent requests into one model call.

One H200 is not filled by one small request (../docs/architecture.md): a 15-sample score
request is ~2,000 tokens, and every call reads all weights once. The batcher lets requests
that arrive while the GPU is busy share the next call. It never waits for company: a worker
that becomes free takes the oldest waiting request plus every other waiting request that
still fits the call's bounds, in arrival order, so an idle server adds no latency.

Workers are threads, one per request context; `run_batch(ctx, items)` does the work and
returns one result per item (or raises, failing every item of that batch).
"""

from __future__ import annotations

import collections
import threading
from concurrent.futures import Future
from typing import Callable, Sequence


class Batcher:
    def __init__(self, contexts: Sequence, run_batch: Callable, fits: Callable[[list, object], bool],
                 name: str = "batcher"):
        self._run_batch, self._fits = run_batch, fits
        self._waiting: collections.deque = collections.deque()
        self._cond = threading.Condition()
        self._closed = False
        self.batches = 0  # calls made
        self.items = 0  # requests served
        self._threads = [threading.Thread(target=self._work, args=(ctx,), name=f"{name}-{i}", daemon=True)
                         for i, ctx in enumerate(contexts)]
        for t in self._threads:
            t.start()

    def submit(self, item):
        """Run `item` in some batch; block until its result is ready and return it (or raise)."""
        future: Future = Future()
        with self._cond:
            if self._closed:
                raise RuntimeError("the engine is closed")
            self._waiting.append((item, future))
            self._cond.notify()
        return future.result()

    def _take(self):
        with self._cond:
            while not self._waiting and not self._closed:
                self._cond.wait()
            if self._closed and not self._waiting:
                return None
            batch = [self._waiting.popleft()]
            items = [batch[0][0]]
            while self._waiting and self._fits(items, self._waiting[0][0]):
                entry = self._waiting.popleft()
                batch.append(entry)
                items.append(entry[0])
            return batch

    def _work(self, ctx):
        while True:
            batch = self._take()
            if batch is None:
                return
            items = [item for item, _ in batch]
            try:
                results = self._run_batch(ctx, items)
            except BaseException as exc:  # every request of the batch learns why
                for _, future in batch:
                    future.set_exception(exc)
                continue
            self.batches += 1
            self.items += len(batch)
            for (_, future), result in zip(batch, results):
                future.set_result(result)

    def close(self):
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        for t in self._threads:
            t.join(timeout=5)
