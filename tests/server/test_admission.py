"""Admission control in-process: FIFO hand-over, fair across clients, queue bound, deadlines,
cancellation, drain.

Blocking work is held on threading.Events, so no test depends on how fast anything runs."""

from __future__ import annotations

import asyncio
import threading

import pytest

from boundgen.errors import Cancelled
from boundgen.server.admission import FLOOD_REFUSALS, MAX_SOURCES, Admission, RecentRefusals
from boundgen.server.status import DeadlineExceeded, Overloaded, Unavailable

LONG = 30.0  # a deadline no test reaches


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, 20.0))


def now():
    return asyncio.get_running_loop().time()


class Work:
    """A blocking job that records it ran and waits for `release`."""

    def __init__(self, log, name):
        self.log, self.name = log, name
        self.started, self.release = threading.Event(), threading.Event()

    def __call__(self):
        self.log.append(self.name)
        self.started.set()
        assert self.release.wait(10.0)
        return self.name


async def wait_until(predicate, what):
    for _ in range(2000):
        if predicate():
            return
        await asyncio.sleep(0.005)
    raise AssertionError(f"never: {what}")


async def one_running_one_queued(adm, log):
    """Client A's "a-first" running (held) and its "a1" queued: (the two Works, their tasks)."""
    first, a1 = Work(log, "a-first"), Work(log, "a1")
    t0 = asyncio.create_task(adm.run(first, now() + LONG, client="A"))
    await asyncio.to_thread(first.started.wait, 10.0)
    ta = asyncio.create_task(adm.run(a1, now() + LONG, client="A"))
    await wait_until(lambda: adm.queued == 1, "a1 queued")
    return (first, a1), (t0, ta)


def test_fifo_and_queue_bound():
    async def main():
        adm, log = Admission("m", max_inflight=1, max_queue=2), []
        a, b, c = Work(log, "a"), Work(log, "b"), Work(log, "c")
        ta = asyncio.create_task(adm.run(a, now() + LONG))
        await asyncio.to_thread(a.started.wait, 10.0)
        tb = asyncio.create_task(adm.run(b, now() + LONG))
        tc = asyncio.create_task(adm.run(c, now() + LONG))
        await wait_until(lambda: adm.queued == 2, "two queued")
        with pytest.raises(Overloaded, match="at capacity"):
            await adm.run(Work(log, "d"), now() + LONG)
        for w in (a, b, c):
            w.release.set()
        assert await asyncio.gather(ta, tb, tc) == ["a", "b", "c"]
        assert log == ["a", "b", "c"] and adm.inflight == 0 and adm.queued == 0
        adm.shutdown()

    run(main())


def test_slots_go_to_clients_in_turn():
    """A's burst of five waits; B's one request, queued after all of it, runs after one of A's."""
    async def main():
        adm, log = Admission("m", max_inflight=1, max_queue=10), []
        first = Work(log, "a-first")
        t0 = asyncio.create_task(adm.run(first, now() + LONG, client="A"))
        await asyncio.to_thread(first.started.wait, 10.0)
        works = [Work(log, f"a{i}") for i in range(5)] + [Work(log, "b")]
        tasks = []
        for w in works:
            tasks.append(asyncio.create_task(adm.run(w, now() + LONG, client="B" if w.name == "b" else "A")))
            await wait_until(lambda: adm.queued == len(tasks), f"{w.name} queued")
        for w in (first, *works):
            w.release.set()
        await asyncio.gather(t0, *tasks)
        assert log == ["a-first", "a0", "b", "a1", "a2", "a3", "a4"]
        adm.shutdown()

    run(main())


def test_a_full_queue_refuses_the_greedy_client_not_the_newcomer():
    async def main():
        adm, log = Admission("m", max_inflight=1, max_queue=3), []
        first = Work(log, "a-first")
        t0 = asyncio.create_task(adm.run(first, now() + LONG, client="A"))
        await asyncio.to_thread(first.started.wait, 10.0)
        works = [Work(log, f"a{i}") for i in range(3)]
        tasks = []
        for w in works:
            tasks.append(asyncio.create_task(adm.run(w, now() + LONG, client="A")))
            await wait_until(lambda: adm.queued == len(tasks), f"{w.name} queued")
        with pytest.raises(Overloaded, match="at capacity"):
            await adm.run(Work(log, "a3"), now() + LONG, client="A")
        b = Work(log, "b")
        tb = asyncio.create_task(adm.run(b, now() + LONG, client="B"))
        with pytest.raises(Overloaded, match="gave its place"):
            await tasks[2]  # A's newest
        assert adm.queued == 3
        for w in (first, *works, b):
            w.release.set()
        assert await asyncio.gather(t0, tasks[0], tasks[1], tb) == ["a-first", "a0", "a1", "b"]
        assert log == ["a-first", "a0", "b", "a1"] and adm.inflight == 0 and adm.queued == 0
        adm.shutdown()

    run(main())


def test_a_full_queues_refusal_is_held_back_from_a_client_with_requests_waiting():
    """A client that already has requests waiting gets its 429 `refusal_hold_s` late (a greedy
    client's refusals, answered at once, come straight back and take the loop's CPU); a client with
    nothing waiting gets its 429 at once; the hold never outlasts the request's deadline."""
    async def main():
        hold = 1.0
        adm, log = Admission("m", max_inflight=1, max_queue=2, refusal_hold_s=hold), []
        (first, a1), (t0, ta) = await one_running_one_queued(adm, log)
        b1 = Work(log, "b1")
        tb = asyncio.create_task(adm.run(b1, now() + LONG, client="B"))
        await wait_until(lambda: adm.queued == 2, "b1 queued")
        loop = asyncio.get_running_loop()
        start = loop.time()
        with pytest.raises(Overloaded, match="at capacity"):  # C has nothing waiting: at once
            await adm.run(Work(log, "c"), now() + LONG, client="C")
        assert loop.time() - start < hold / 2
        start = loop.time()
        with pytest.raises(Overloaded, match="at capacity"):  # A has a1 waiting: held
            await adm.run(Work(log, "a2"), now() + LONG, client="A")
        assert loop.time() - start >= hold * 0.95
        start = loop.time()
        with pytest.raises(Overloaded):  # held, but not past its deadline
            await adm.run(Work(log, "a3"), now() + 0.05, client="A")
        assert loop.time() - start < hold / 2
        assert adm.queued == 2
        for w in (first, a1, b1):
            w.release.set()
        assert await asyncio.gather(t0, ta, tb) == ["a-first", "a1", "b1"]
        adm.shutdown()

    run(main())


def test_an_address_refused_many_times_in_a_moment_has_its_refusals_held_whatever_ids_it_sends():
    """One host sending each request under a new client id has nothing waiting under any of them:
    its first FLOOD_REFUSALS refusals in the hold's window come at once, the next are held; another
    address's refusal still comes at once."""
    async def main():
        hold = 1.0
        adm, log = Admission("m", max_inflight=1, max_queue=1, refusal_hold_s=hold), []
        (first, a1), (t0, ta) = await one_running_one_queued(adm, log)
        loop = asyncio.get_running_loop()
        start = loop.time()
        for i in range(FLOOD_REFUSALS - 1):
            with pytest.raises(Overloaded):
                await adm.run(Work(log, f"x{i}"), now() + LONG, client=f"id:x{i}", source="10.0.0.9")
        assert loop.time() - start < hold / 2
        with pytest.raises(Overloaded):  # the address's FLOOD_REFUSALS-th in the window: held
            await adm.run(Work(log, "x-last"), now() + LONG, client="id:x-last", source="10.0.0.9")
        assert loop.time() - start >= hold * 0.95
        start = loop.time()
        with pytest.raises(Overloaded):  # another host, nothing waiting: at once
            await adm.run(Work(log, "y"), now() + LONG, client="id:y", source="10.0.0.10")
        assert loop.time() - start < hold / 2
        for w in (first, a1):
            w.release.set()
        assert await asyncio.gather(t0, ta) == ["a-first", "a1"]
        adm.shutdown()

    run(main())


def test_recent_refusals_count_an_address_over_the_window_and_forget_quiet_ones():
    clock = [0.0]
    refusals = RecentRefusals(0.1, clock=lambda: clock[0])
    assert not any(refusals.note("h") for _ in range(FLOOD_REFUSALS - 1))
    assert refusals.note("h")  # the FLOOD_REFUSALS-th within 0.1 s
    clock[0] = 1.0
    assert not refusals.note("h")  # the window moved on: the older ones no longer count
    assert not refusals.note("")  # an unknown address is never counted
    assert not RecentRefusals(0.0).note("h")  # no hold, nothing counted
    for i in range(MAX_SOURCES + 10):  # many quiet addresses: the table stays bounded
        clock[0] += 1.0
        refusals.note(f"10.1.{i // 256}.{i % 256}")
    assert len(refusals._times) <= MAX_SOURCES


def test_a_held_refusal_is_answered_when_the_server_closes():
    """A drain waits for no refusal: closing admission answers the held 429s at once."""
    async def main():
        adm, log = Admission("m", max_inflight=1, max_queue=1, refusal_hold_s=LONG), []
        (first, a1), (t0, ta) = await one_running_one_queued(adm, log)
        held = asyncio.create_task(adm.run(Work(log, "a2"), now() + LONG, client="A"))
        await asyncio.sleep(0.05)
        assert not held.done()
        adm.close()
        with pytest.raises(Overloaded):
            await asyncio.wait_for(held, 5.0)
        for w in (first, a1):
            w.release.set()
        assert await asyncio.gather(t0, ta) == ["a-first", "a1"]
        adm.shutdown()

    run(main())


def test_without_a_hold_every_refusal_is_at_once():
    async def main():
        adm, log = Admission("m", max_inflight=1, max_queue=1), []
        (first, a1), (t0, ta) = await one_running_one_queued(adm, log)
        with pytest.raises(Overloaded):
            await asyncio.wait_for(adm.run(Work(log, "a2"), now() + LONG, client="A"), 5.0)
        for w in (first, a1):
            w.release.set()
        await asyncio.gather(t0, ta)
        adm.shutdown()

    run(main())


def test_deadline_in_queue_never_runs():
    async def main():
        adm, log = Admission("m", max_inflight=1, max_queue=4), []
        a = Work(log, "a")
        ta = asyncio.create_task(adm.run(a, now() + LONG))
        await asyncio.to_thread(a.started.wait, 10.0)
        with pytest.raises(DeadlineExceeded, match="not run"):
            await adm.run(Work(log, "late"), now() + 0.05)
        assert adm.queued == 0
        a.release.set()
        await ta
        assert log == ["a"]
        adm.shutdown()

    run(main())


def test_answer_after_deadline_is_dropped():
    async def main():
        adm, log = Admission("m", max_inflight=1, max_queue=0), []
        w = Work(log, "slow")
        task = asyncio.create_task(adm.run(w, now() + 0.05))
        await asyncio.to_thread(w.started.wait, 10.0)
        await asyncio.sleep(0.1)
        w.release.set()
        with pytest.raises(DeadlineExceeded, match="after the request's deadline"):
            await task
        adm.shutdown()

    run(main())


async def learn_a_slow_call(adm, log, seconds: float) -> None:
    slow = Work(log, "slow")
    task = asyncio.create_task(adm.run(slow, now() + LONG))
    await asyncio.to_thread(slow.started.wait, 10.0)
    await asyncio.sleep(seconds)  # the engine call takes >= `seconds`: the estimate learns it
    slow.release.set()
    await task


def test_request_that_cannot_finish_in_time_leaves_its_slot_to_one_waiting():
    async def main():
        adm, log = Admission("m", max_inflight=1, max_queue=2), []
        await learn_a_slow_call(adm, log, 0.4)
        blocker, hopeless, waiting = Work(log, "blocker"), Work(log, "hopeless"), Work(log, "waiting")
        waiting.release.set()
        t_blocker = asyncio.create_task(adm.run(blocker, now() + LONG))
        await asyncio.to_thread(blocker.started.wait, 10.0)
        t_hopeless = asyncio.create_task(adm.run(hopeless, now() + 0.3, client="h"))
        t_waiting = asyncio.create_task(adm.run(waiting, now() + LONG, client="w"))
        await wait_until(lambda: adm.queued == 2, "both queued")
        blocker.release.set()  # after ~0 s: the estimate stays ~0.3 s, more than the hopeless one has left
        await t_blocker
        with pytest.raises(DeadlineExceeded, match="needs about"):
            await t_hopeless
        assert await t_waiting == "waiting"
        assert log == ["slow", "blocker", "waiting"]
        adm.shutdown()

    run(main())


def test_one_slow_call_does_not_refuse_every_later_request():
    """With nobody waiting, a request runs whatever the estimate says (a refused request would never
    teach it otherwise): before, one 1.1 s call left every request with the default 1 s deadline
    refused for good, with the model idle."""
    async def main():
        adm, log = Admission("m", max_inflight=1, max_queue=2), []
        await learn_a_slow_call(adm, log, 0.4)
        for i in range(3):
            quick = Work(log, f"quick{i}")
            quick.release.set()
            assert await adm.run(quick, now() + 0.2) == f"quick{i}"  # 0.2 s left, the estimate ~0.4 s or less
        assert adm._compute_estimate < 0.4 * (1 - 0.2) ** 2
        adm.shutdown()

    run(main())


def test_calls_side_by_side_each_move_the_estimate():
    """Each update starts from the estimate as it is when the call ends: two calls that started while
    it was 0 used to each set it to their own duration, the last one winning."""
    async def main():
        adm, log = Admission("m", max_inflight=2, max_queue=0), []
        a, b = Work(log, "a"), Work(log, "b")
        ta, tb = asyncio.create_task(adm.run(a, now() + LONG)), asyncio.create_task(adm.run(b, now() + LONG))
        await asyncio.to_thread(a.started.wait, 10.0)
        await asyncio.to_thread(b.started.wait, 10.0)
        a.release.set()
        await ta  # ~0 s: the first sample
        await asyncio.sleep(0.5)
        b.release.set()
        await tb  # ~0.5 s: moves it a fifth of the way, not all of it
        assert 0.05 < adm._compute_estimate < 0.2
        adm.shutdown()

    run(main())


def test_past_deadline_is_refused_on_arrival():
    async def main():
        adm = Admission("m", 1, 1)
        with pytest.raises(DeadlineExceeded, match="already passed"):
            await adm.run(lambda: None, now() - 1.0)
        adm.shutdown()

    run(main())


def test_cancel_while_queued_frees_the_place():
    async def main():
        adm, log = Admission("m", max_inflight=1, max_queue=1), []
        a, c = Work(log, "a"), Work(log, "c")
        ta = asyncio.create_task(adm.run(a, now() + LONG))
        await asyncio.to_thread(a.started.wait, 10.0)
        tb = asyncio.create_task(adm.run(Work(log, "b"), now() + LONG))
        await wait_until(lambda: adm.queued == 1, "b queued")
        tb.cancel()
        await wait_until(lambda: adm.queued == 0, "b's place freed")
        tc = asyncio.create_task(adm.run(c, now() + LONG))  # would be 429 if b still held the place
        await wait_until(lambda: adm.queued == 1, "c queued")
        a.release.set()
        c.release.set()
        assert await ta == "a" and await tc == "c"
        assert log == ["a", "c"]
        adm.shutdown()

    run(main())


def test_cancel_while_running_holds_the_slot_until_the_engine_returns():
    async def main():
        adm, log = Admission("m", max_inflight=1, max_queue=1), []
        a, b = Work(log, "a"), Work(log, "b")
        ta = asyncio.create_task(adm.run(a, now() + LONG))
        await asyncio.to_thread(a.started.wait, 10.0)
        ta.cancel()
        await asyncio.sleep(0.05)
        assert adm.inflight == 1  # the engine call is still running
        tb = asyncio.create_task(adm.run(b, now() + LONG))
        await wait_until(lambda: adm.queued == 1, "b waits for a's slot")
        a.release.set()
        b.release.set()
        assert await tb == "b"
        assert adm.inflight == 0
        adm.shutdown()

    run(main())


def test_cancel_reaches_the_engine_call():
    """The event handed to run() is set when the caller is cancelled: an engine call waiting on it
    (as a request queued inside a busy engine does) returns at once, unrun, and frees the slot."""

    async def main():
        adm = Admission("m", max_inflight=1, max_queue=1)
        gone, entered, ran = threading.Event(), threading.Event(), []

        def engine_call():
            entered.set()
            assert gone.wait(10.0), "the cancel never reached the engine call"
            raise Cancelled("waited inside the engine; not run")

        task = asyncio.create_task(adm.run(engine_call, now() + LONG, gone))
        await asyncio.to_thread(entered.wait, 10.0)
        task.cancel()
        await wait_until(lambda: adm.inflight == 0, "the slot freed")
        with pytest.raises(asyncio.CancelledError):
            await task
        b = Work(ran, "b")
        b.release.set()
        assert await adm.run(b, now() + LONG) == "b"
        adm.shutdown()

    run(main())


def test_close_rejects_new_and_lets_admitted_finish():
    async def main():
        adm, log = Admission("m", max_inflight=1, max_queue=1), []
        a, b = Work(log, "a"), Work(log, "b")
        ta = asyncio.create_task(adm.run(a, now() + LONG))
        await asyncio.to_thread(a.started.wait, 10.0)
        tb = asyncio.create_task(adm.run(b, now() + LONG))
        await wait_until(lambda: adm.queued == 1, "b queued")
        adm.close()
        with pytest.raises(Unavailable):
            await adm.run(lambda: None, now() + LONG)
        idle = asyncio.create_task(adm.wait_idle())
        a.release.set()
        b.release.set()
        assert await ta == "a" and await tb == "b"
        await asyncio.wait_for(idle, 5.0)
        adm.shutdown()

    run(main())
