"""The peer's batcher: waiting requests share a call, up to max_batch, each caller gets its own result."""

import threading
import time

import pytest

from boundgen.bench.peer_batching import Batcher


def test_waiting_requests_share_calls_up_to_max_batch():
    calls, release = [], threading.Event()

    def run(requests):
        calls.append(list(requests))
        release.wait(5)  # the first call holds the device while the others queue
        return [r * 10 for r in requests]

    batcher = Batcher(run, max_batch=3)
    results = {}
    threads = [threading.Thread(target=lambda i=i: results.__setitem__(i, batcher(i))) for i in range(7)]
    threads[0].start()
    while not calls:
        time.sleep(0.01)
    for t in threads[1:]:
        t.start()
    while batcher._todo.qsize() < 6:
        time.sleep(0.01)
    release.set()
    for t in threads:
        t.join(5)
    assert results == {i: i * 10 for i in range(7)}
    assert [len(c) for c in calls] == [1, 3, 3] and batcher.sizes == {1: 1, 3: 2}
    assert batcher.call_batch([5, 6]) == [50, 60] and batcher.sizes == {1: 1, 3: 2}  # formed: not counted
    batcher.close()


def test_a_failed_call_fails_each_of_its_callers():
    def run(requests):
        raise RuntimeError(f"out of memory for {len(requests)}")

    batcher = Batcher(run, max_batch=2)
    with pytest.raises(RuntimeError, match="out of memory for 1"):
        batcher("a")
    with pytest.raises(ValueError, match="positive"):
        Batcher(run, max_batch=0)
    batcher.close()

