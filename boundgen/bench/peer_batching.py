"""Up to `max_batch` waiting requests in one peer call, as a serving wrapper around HF would batch.

The load generator calls the peer from several threads; here each caller queues its request
and waits. One worker thread runs every model call: it takes the oldest request, adds whatever
else is already waiting (at most `max_batch` in all, no timer: an idle peer never waits for
company), runs them in one call and hands each caller its own result or the call's exception.
With `max_batch=1` this is one request at a time, in arrival order.

Warm-up goes through the same thread (`call_batch`, a batch formed by the caller): CUDA graphs
recorded by torch.compile's "reduce-overhead" mode belong to the thread that recorded them.
"""

from __future__ import annotations

import queue
import threading
from dataclasses import dataclass, field
from typing import Callable, Sequence


@dataclass(eq=False)
class _Waiting:
    """Caller's requests waiting for the worker (caller thread -> worker -> caller): the worker fills
    in `results` (one per request) or `error`, then sets `done`."""

    requests: list
    formed: bool  # a batch formed by the caller (warm-up, probes): run as given, not counted
    done: threading.Event = field(default_factory=threading.Event)
    results: list | None = None
    error: Exception | None = None


class Batcher:
    def __init__(self, run_batch: Callable[[Sequence], list], max_batch: int = 1):
        if max_batch <= 0:
            raise ValueError(f"max_batch must be positive, got {max_batch}")
        self.run_batch, self.max_batch = run_batch, max_batch
        self.sizes: dict[int, int] = {}  # requests per call -> calls, for calls of queued requests
        self._todo: queue.Queue[_Waiting | None] = queue.Queue()  # None: close
        self._worker = threading.Thread(target=self._loop, daemon=True, name="peer-batcher")
        self._worker.start()

    def __call__(self, request):
        return self._submit([request], formed=False)[0]

    def call_batch(self, requests: Sequence) -> list:
        """These requests in one call, as given (warm-up, probes); not counted in `sizes`."""
        return self._submit(list(requests), formed=True)

    def close(self) -> None:
        self._todo.put(None)

    def _submit(self, requests: list, formed: bool) -> list:
        waiting = _Waiting(requests, formed)
        self._todo.put(waiting)
        waiting.done.wait()
        if waiting.error is not None:
            raise waiting.error
        return waiting.results

    def _loop(self) -> None:
        while True:
            first = self._todo.get()
            if first is None:
                return
            items = [first]
            while not first.formed and len(items) < self.max_batch:
                try:
                    item = self._todo.get_nowait()
                except queue.Empty:
                    break
                if item is None or item.formed:
                    self._todo.put(item)  # a close or a formed batch: after this call
                    break
                items.append(item)
            if not first.formed:
                self.sizes[len(items)] = self.sizes.get(len(items), 0) + 1
            self._run(items)

    def _run(self, items: list[_Waiting]) -> None:
        try:
            results = self.run_batch([r for item in items for r in item.requests])
            start = 0
            for item in items:
                item.results = results[start: start + len(item.requests)]
                start += len(item.requests)
        except Exception as exc:  # every caller of the call sees the failure
            for item in items:
                item.error = exc
        for item in items:
            item.done.set()
