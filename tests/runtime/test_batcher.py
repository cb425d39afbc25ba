"""The batcher: concurrent submissions share calls within bounds; results go to their callers;
cancelled requests never run."""

import threading
import time

import pytest

from boundgen.errors import Cancelled, Overloaded
from boundgen.runtime import batcher as batcher_module
from boundgen.runtime.batcher import Batcher
from tests.runtime.held import in_thread, wait_until


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


def held_batcher(gate: threading.Event, calls: list) -> Batcher:
    """One worker whose first call waits for `gate`; a call holds at most two items."""

    def run_batch(ctx, items):
        calls.append(list(items))
        if len(calls) == 1:
            assert gate.wait(10), "the test never opened the gate"
        return [x * 10 for x in items]

    return Batcher(["ctx"], run_batch, fits=lambda batch, item: len(batch) < 2)


def test_a_cancelled_caller_leaves_the_queue_while_the_worker_is_busy():
    gate, calls = threading.Event(), []
    batcher = held_batcher(gate, calls)
    try:
        first, first_out = in_thread(batcher.submit, 1)
        wait_until(lambda: calls == [[1]], "the worker is busy")
        gone = threading.Event()
        thread, out = in_thread(batcher.submit, 2, cancelled=gone)
        wait_until(lambda: len(batcher._waiting) == 1, "2 is queued")
        gone.set()
        thread.join(10)
        assert not thread.is_alive() and isinstance(out.get("error"), Cancelled), out
        assert not batcher._waiting and batcher.cancelled == 1
        gone_before = threading.Event()
        gone_before.set()
        with pytest.raises(Cancelled, match="not run"):
            batcher.submit(3, cancelled=gone_before)
        gate.set()
        first.join(10)
        assert first_out == {"result": 10}
        assert batcher.submit(4, cancelled=threading.Event()) == 40
        assert calls == [[1], [4]]
    finally:
        gate.set()
        batcher.close()


def test_a_worker_drops_cancelled_requests_before_taking_a_batch(monkeypatch):
    """Callers that never look at their event (wait_slice patched to wait for good) still get
    Cancelled: the worker drops their requests, so they take no room in the call."""
    monkeypatch.setattr(batcher_module, "wait_slice", lambda now, deadline, cancelled: None)
    gate, calls = threading.Event(), []
    batcher = held_batcher(gate, calls)
    try:
        first, _ = in_thread(batcher.submit, 1)
        wait_until(lambda: calls == [[1]], "the worker is busy")
        events = {2: threading.Event(), 3: None, 4: threading.Event(), 5: None}
        waiting = []
        for item, event in events.items():
            waiting.append(in_thread(batcher.submit, item, cancelled=event))
            wait_until(lambda: len(batcher._waiting) == len(waiting), f"{item} is queued")
        events[2].set()
        events[4].set()
        gate.set()
        for thread, _ in [(first, None), *waiting]:
            thread.join(10)
        outs = dict(zip(events, (out for _, out in waiting)))
        assert isinstance(outs[2].get("error"), Cancelled) and isinstance(outs[4].get("error"), Cancelled), outs
        assert outs[3] == {"result": 30} and outs[5] == {"result": 50}
        assert calls == [[1], [3, 5]] and batcher.cancelled == 2  # 3 and 5 share the two places
    finally:
        gate.set()
        batcher.close()


def _closed_loop(linger_s: float, clients: int = 3, rounds: int = 6, think_s: float = 0.02,
                 learn: bool = False) -> list[int]:
    """Call sizes when `clients` each send a request, wait for its result, think `think_s` and send
    the next (a call takes 50 ms)."""
    sizes = []

    def run_batch(ctx, items):
        time.sleep(0.05)
        sizes.append(len(items))
        return items

    batcher = Batcher(["ctx"], run_batch, fits=lambda batch, item: len(batch) < clients, linger_s=linger_s,
                      learn_linger=learn)

    def client(k):
        for r in range(rounds):
            assert batcher.submit((k, r)) == (k, r)
            time.sleep(think_s)

    threads = [threading.Thread(target=client, args=(k,)) for k in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    batcher.close()
    return sizes


def test_lingering_after_a_call_lets_returning_clients_share_the_next_one():
    sizes = _closed_loop(linger_s=1.0)
    assert sum(sizes) == 18
    # the first call may split the clients (who arrives first runs at once), and a client a round
    # behind ends alone; in between every call holds all three (no lingering: 1, 2, 1, 2, ...)
    assert sizes.count(3) >= 4 and len(sizes) <= 8, f"returning clients did not share calls: {sizes}"


def test_a_learned_wait_lets_clients_slower_than_the_fixed_wait_share_calls():
    """Clients back 10 ms after their answers against a fixed wait of 2 ms: every call misses some
    (1, 2, 1, 2, ...); learned from their returns, the wait grows to ~10 ms and calls hold all three."""
    fixed = _closed_loop(linger_s=0.002, rounds=16, think_s=0.01)
    learned = _closed_loop(linger_s=0.002, rounds=16, think_s=0.01, learn=True)
    assert sum(fixed) == sum(learned) == 48
    assert fixed.count(3) <= 4, f"a fixed 2 ms wait caught clients 10 ms away: {fixed}"
    # the first ~6 calls learn (8 delays), then the calls hold all three (13 such calls if none is missed)
    assert learned.count(3) >= 9 and len(learned) <= 22, f"the learned wait did not fill calls: {learned}"


def test_a_worker_lingers_at_most_its_limit_and_never_on_an_idle_engine():
    batcher = Batcher(["ctx"], lambda ctx, items: items, fits=lambda batch, item: True, linger_s=0.3)

    def timed(item):
        start = time.monotonic()
        assert batcher.submit(item) == item
        return time.monotonic() - start

    first = timed(7)  # no call before it
    batcher._last_call = (time.monotonic(), 3)  # as if a call of 3 had just ended
    lingered = timed(8)
    after_one = timed(9)  # the last call held 1 and nobody waited then: one request is company enough
    time.sleep(0.35)
    batcher._last_call = (batcher._last_call[0], 3)
    idle = timed(10)  # the last call ended longer than 0.3 s ago
    batcher.close()
    assert 0.25 <= lingered < 5, lingered
    assert max(first, after_one, idle) < 0.25, (first, after_one, idle)


def test_a_worker_stops_lingering_once_the_waiting_requests_fill_a_call():
    batcher = Batcher(["ctx"], lambda ctx, items: items, fits=lambda batch, item: len(batch) < 2, linger_s=30.0)
    batcher._last_call = (time.monotonic(), 5)  # five expected, but a call holds two
    results = {}
    threads = [threading.Thread(target=lambda i=i: results.__setitem__(i, batcher.submit(i))) for i in range(3)]
    start = time.monotonic()
    for t in threads:
        t.start()
    wait_until(lambda: len(results) >= 2, "a call of the first two")
    took = time.monotonic() - start
    batcher._last_call = (float("-inf"), 0)  # let the third go
    with batcher._cond:
        batcher._cond.notify_all()
    threads[2].join(10)
    batcher.close()
    assert results == {0: 0, 1: 1, 2: 2}
    assert took < 10, "a full call kept waiting for company"


def test_enqueue_without_waiting_and_withdraw_while_queued():
    """A request tokenized in another process is queued without a waiting thread; withdrawn while
    it still waits, it never runs and its future says why; one already taken runs to the end."""
    from boundgen.errors import DeadlineExceeded

    gate, ran = threading.Event(), []

    def run_batch(ctx, items):
        gate.wait(5)
        ran.extend(items)
        return list(items)

    batcher = Batcher(["ctx"], run_batch, fits=lambda batch, item: False)
    first = batcher.enqueue("first")
    wait_until(lambda: batcher.queued == 0, "the worker taking the first request")  # it waits on the gate
    second = batcher.enqueue("second", cancelled=threading.Event())
    expired = batcher.enqueue("expired", deadline=time.monotonic() + 0.05)
    assert batcher.queued == 2
    second.cancelled.set()
    assert batcher.withdraw(second)
    time.sleep(0.06)
    assert batcher.withdraw(expired)
    assert not batcher.withdraw(first), "a request in a call cannot be withdrawn"
    gate.set()
    assert first.future.result(5) == "first"
    with pytest.raises(Cancelled):
        second.future.result(1)
    with pytest.raises(DeadlineExceeded):
        expired.future.result(1)
    batcher.close()
    assert ran == ["first"]
    assert (batcher.cancelled, batcher.expired) == (1, 1)


def _held_batcher():
    """One worker, one request a call, whose first call waits for `gate`: (batcher, gate, calls)."""
    gate, calls = threading.Event(), []

    def run_batch(ctx, items):
        calls.append(list(items))
        if len(calls) == 1:
            assert gate.wait(10), "the test never opened the gate"
        return items

    return Batcher(["ctx"], run_batch, fits=lambda batch, item: False), gate, calls


def test_a_burst_from_one_client_does_not_delay_another_behind_all_of_it():
    """One worker, one request a call: A queues 10 while the worker is busy, then B queues 1; B's
    request is in the next call but one (after one of A's), not after all ten."""
    batcher, gate, calls = _held_batcher()
    try:
        first = batcher.enqueue("a-first", client="A")
        wait_until(lambda: calls == [["a-first"]], "the worker is busy")
        burst = [batcher.enqueue(f"a{i}", client="A") for i in range(10)]
        late = batcher.enqueue("b", client="B")
        gate.set()
        for ticket in (first, *burst, late):
            ticket.future.result(10)
        order = [c[0] for c in calls]
        assert order.index("b") == 2, order
        assert [x for x in order if x.startswith("a")] == ["a-first", *(f"a{i}" for i in range(10))]
    finally:
        gate.set()
        batcher.close()


def test_a_full_queue_refuses_the_greedy_client_not_the_newcomer():
    """At max_queue, a request of a client with fewer waiting takes the place of the newest request
    of the client with the most (that one fails Overloaded, never run); a request of the greedy
    client itself is refused at once."""
    batcher, gate, calls = _held_batcher()
    try:
        first = batcher.enqueue("a-first", client="A")
        wait_until(lambda: calls == [["a-first"]], "the worker is busy")
        queued = [batcher.enqueue(f"a{i}", client="A", max_queue=3) for i in range(3)]
        with pytest.raises(Overloaded, match="at capacity"):
            batcher.enqueue("a3", client="A", max_queue=3)
        b = batcher.enqueue("b", client="B", max_queue=3)
        with pytest.raises(Overloaded, match="gave its place"):
            queued[2].future.result(0)
        assert batcher.queued == 3
        gate.set()
        for ticket in (first, *queued[:2], b):
            ticket.future.result(10)
        assert sorted(c[0] for c in calls) == ["a-first", "a0", "a1", "b"]
    finally:
        gate.set()
        batcher.close()


def test_a_closed_batcher_lets_go_of_its_engine():
    """An engine holds its batcher and the batcher the engine's bound methods: once closed, the
    batcher drops them, so a replaced engine (and its device memory) is freed by reference
    counting, without waiting for a full garbage collection."""
    import gc
    import weakref

    class Engine:
        def __init__(self):
            self.batcher = Batcher(["ctx"], self.run_batch, fits=self.fits)

        def run_batch(self, ctx, items):
            return items

        def fits(self, batch, item):
            return True

    engine = Engine()
    assert engine.batcher.enqueue(1).future.result(timeout=10) == 1
    engine.batcher.close()
    gone = weakref.ref(engine)
    gc.disable()
    try:
        del engine
        assert gone() is None
    finally:
        gc.enable()
