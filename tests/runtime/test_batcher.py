"""The batcher: concurrent submissions share calls within bounds; results go to their callers."""

import threading
import time

import pytest

from boundgen.runtime.batcher import Batcher


def test_results_reach_their_callers_and_batches_respect_bounds():
    calls = []
    gate = threading.Event()

    def run_batch(ctx, items):
        gate.wait(5)
        calls.append(list(items))
        return [x * 10 for x in items]

    batcher = Batcher(["ctx"], run_batch, fits=lambda batch, item: sum(batch) + item <= 10)
    results = {}
    threads = [threading.Thread(target=lambda i=i: results.__setitem__(i, batcher.submit(i))) for i in range(1, 8)]
    for t in threads:
        t.start()
        time.sleep(0.01)  # arrival order 1..7 while the first call waits on the gate
    gate.set()
    for t in threads:
        t.join(5)
    batcher.close()
    assert results == {i: i * 10 for i in range(1, 8)}
    assert all(sum(c) <= 10 or len(c) == 1 for c in calls)
    assert sorted(x for c in calls for x in c) == list(range(1, 8))
    assert len(calls) < 7, "waiting requests were never batched"
    assert [x for c in calls for x in c] == list(range(1, 8)), "arrival order not kept"


def test_a_failing_batch_fails_only_its_requests():
    def run_batch(ctx, items):
        if 13 in items:
            raise ValueError("bad item")
        return items

    batcher = Batcher(["a"], run_batch, fits=lambda batch, item: False)
    with pytest.raises(ValueError, match="bad item"):
        batcher.submit(13)
    assert batcher.submit(4) == 4
    batcher.close()
    with pytest.raises(RuntimeError, match="closed"):
        batcher.submit(1)
