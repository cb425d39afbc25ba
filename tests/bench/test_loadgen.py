"""Load generator statistics, stopping rules and the capacity point, on fake targets (no timing asserts)."""

import threading
from dataclasses import dataclass, field

import pytest

from boundgen.bench import loadgen
from boundgen.bench.loadgen import LatencyBudget, Record, capacity_point, closed_loop, open_loop, summarize, sweep


@dataclass
class Req:
    index: int
    samples: int = 15


@dataclass
class Res:
    timings: dict = field(default_factory=dict)


class FakeClock(loadgen.Clock):
    """Time advances only when the fake target says so."""

    def __init__(self):
        self.t = 100.0
        self.lock = threading.Lock()

    def now(self):
        with self.lock:
            return self.t

    def advance(self, dt):
        with self.lock:
            self.t += dt

    def sleep_until(self, t):
        with self.lock:
            self.t = max(self.t, t)


def test_nearest_rank_percentiles():
    values = list(range(1, 101))  # 1..100
    assert loadgen.nearest_rank(values, 50) == 50
    assert loadgen.nearest_rank(values, 99) == 99
    assert loadgen.nearest_rank([5.0], 99) == 5.0
    assert loadgen.nearest_rank([1, 2, 3], 50) == 2


def test_summarize_known_latencies():
    # 100 requests in a 2 s window: latencies 1..100 ms; timings pre 1 ms, model 0.5 x latency, post 0.
    recs = []
    for i in range(100):
        lat = (i + 1) / 1e3
        recs.append(Record(i, start=10.0 + i * 0.01, end=10.0 + i * 0.01 + lat, samples=15, work=0.002,
                           timings={"pre": 0.001, "model": lat / 2, "post": 0.0}))
    recs.append(Record(100, 10.5, 10.6, error="InvalidInput"))
    recs.append(Record(101, 9.0, 9.5))  # ended before the window: ignored
    s = summarize(recs, (10.0, 12.0), concurrency=4)
    assert s.completed == 100 and s.errors == {"InvalidInput": 1}
    assert s.qps == pytest.approx(50.0) and s.samples_per_s == pytest.approx(750.0)
    assert s.mean_ms == pytest.approx(50.5) and s.p50_ms == pytest.approx(50.0)
    assert s.p99_ms == pytest.approx(99.0) and s.max_ms == pytest.approx(100.0)
    assert s.breakdown_ms["pre"] == pytest.approx(1.0)
    assert s.breakdown_ms["model"] == pytest.approx(25.25)
    assert s.breakdown_ms["queue"] == pytest.approx(50.5 - 1.0 - 25.25)
    assert s.effective_mfu is None
    assert not s.within_budget  # mean 50.5 ms > 20 ms
    s2 = summarize(recs, (10.0, 12.0), with_mfu=True, budget=LatencyBudget(mean_ms=60, p99_ms=100))
    assert s2.effective_mfu == pytest.approx(100 * 0.002 / 2.0)
    assert s2.within_budget
    assert not summarize(recs, (10.0, 12.0), budget=LatencyBudget(mean_ms=60, p99_ms=99)).within_budget  # strict <


def test_closed_loop_at_concurrency_one_on_a_fake_clock():
    clock = FakeClock()  # starts at 100.0; steps of 1/4 s keep the arithmetic exact
    seen = []

    def target(req):
        seen.append(req.index)
        clock.advance(0.25)
        return Res({"pre": 0.0625, "model": 0.125, "post": 0.03125})

    reqs = [Req(i) for i in range(7)]
    s = closed_loop(target, reqs, 1, duration_s=100.0, warmup_s=1.0, max_requests=50, clock=clock,
                    work_of=lambda r: 0.125, progress=None)
    # completions at 100.25 k; the window opens at 101.0 (k = 4 is inside) and closes at the 50th
    # completion inside it, k = 53, at 113.25
    assert s.completed == 50 and not s.errors and not s.unfinished
    assert s.window_s == 12.25
    assert s.qps == pytest.approx(50 / 12.25) and s.samples_per_s == pytest.approx(15 * 50 / 12.25)
    assert s.mean_ms == pytest.approx(250.0) and s.p50_ms == pytest.approx(250.0) and s.p99_ms == pytest.approx(250.0)
    assert s.breakdown_ms == pytest.approx({"pre": 62.5, "model": 125.0, "post": 31.25, "queue": 31.25})
    assert s.effective_mfu == pytest.approx(50 * 0.125 / 12.25)
    assert seen[:9] == [0, 1, 2, 3, 4, 5, 6, 0, 1]  # round robin over the pool
    assert not s.within_budget  # 250 ms


def test_closed_loop_time_bound_and_slow_target_stretch():
    clock = FakeClock()

    def slow(req):
        clock.advance(1.0)
        return Res()

    s = closed_loop(slow, [Req(0)], 1, duration_s=2.5, warmup_s=0.0, min_requests=5, clock=clock, progress=None)
    assert s.completed == 5 and s.window_s == pytest.approx(5.0)  # stretched to 5 completions
    s = closed_loop(slow, [Req(0)], 1, duration_s=2.5, warmup_s=0.0, min_requests=2, clock=clock, progress=None)
    assert s.completed == 2 and s.window_s == pytest.approx(2.5)  # cut at the time limit


class ThreadClock(loadgen.Clock):
    """Each thread reads its own time, which its target sets: completions can reach the load
    generator in another order than their end times."""

    def __init__(self):
        self.local = threading.local()

    def now(self):
        return getattr(self.local, "t", 100.0)


def test_closed_loop_window_covers_every_counted_request_whatever_order_they_report():
    """The request that ends last reports first; the window must still hold all max_requests
    (a flake in tests/bench/test_profile.py until the window end was the latest counted end)."""
    clock = ThreadClock()
    first_reported = threading.Event()

    def target(req):
        if req.index == 0:
            clock.local.t = 110.0  # ends last ...
            first_reported.set()
        elif req.index == 1:
            first_reported.wait(5)
            threading.Event().wait(0.05)  # ... and reports first (lets index 0 take the lock)
            clock.local.t = 105.0
        else:  # index 0's thread, next request: stays out of the way until the level is over
            threading.Event().wait(0.5)
            clock.local.t = 200.0
        return Res()

    s = closed_loop(target, [Req(i) for i in range(3)], 2, duration_s=1000.0, warmup_s=0.0, max_requests=2,
                    clock=clock, progress=None)
    assert s.completed == 2 and s.window_s == pytest.approx(10.0)


def test_closed_loop_counts_errors_and_keeps_concurrency():
    lock = threading.Lock()
    state = {"in_flight": 0, "peak": 0, "n": 0}
    barrier = threading.Barrier(4)

    def target(req):
        with lock:
            state["in_flight"] += 1
            state["peak"] = max(state["peak"], state["in_flight"])
            state["n"] += 1
            n = state["n"]
        if n <= 4:
            barrier.wait(timeout=10)  # the first four calls are all in flight together
        with lock:
            state["in_flight"] -= 1
        if req.index % 3 == 0:
            raise ValueError("bad request")
        return Res()

    s = closed_loop(target, [Req(i) for i in range(6)], 4, duration_s=60.0, warmup_s=0.0, max_requests=60,
                    progress=None)
    assert state["peak"] == 4
    total = s.completed + sum(s.errors.values())
    assert total >= 60 and set(s.errors) <= {"ValueError"} and s.errors["ValueError"] > 0


def test_error_name_uses_grpc_status_code():
    class Code:
        name = "RESOURCE_EXHAUSTED"

    class RpcError(Exception):
        def code(self):
            return Code()

    assert loadgen.error_name(RpcError()) == "grpc.RESOURCE_EXHAUSTED"
    assert loadgen.error_name(KeyError("x")) == "KeyError"


def test_poisson_arrivals_are_seeded():
    a = loadgen.poisson_arrivals(200.0, 5.0, seed=1)
    assert (a == loadgen.poisson_arrivals(200.0, 5.0, seed=1)).all()
    assert len(a) != len(loadgen.poisson_arrivals(200.0, 5.0, seed=2)) or (a != loadgen.poisson_arrivals(200.0, 5.0, 2)).any()
    assert 0 <= a.min() and a.max() < 5.0 and (a[1:] >= a[:-1]).all()
    assert 850 < len(a) < 1150  # 1000 expected; 4.7 sigma either side


def test_open_loop_sends_every_scheduled_arrival():
    n_expected = len(loadgen.poisson_arrivals(400.0, 0.5, seed=3))
    calls = []
    s = open_loop(lambda r: calls.append(r.index) or Res({"model": 0.0}), [Req(i) for i in range(5)], 400.0,
                  duration_s=0.5, seed=3, progress=None)
    assert s.mode == "open" and s.rate == 400.0
    assert s.completed == n_expected == len(calls) and s.unfinished == 0 and not s.errors


def _level(c, qps, mean=5.0, p99=10.0, errors=None):
    within = mean < 20 and p99 < 80
    return loadgen.LevelStats("closed", c, None, 1.0, int(qps), errors or {}, 0, qps, qps, mean, mean, p99, p99,
                              None, None, within)


def test_sweep_stops_when_throughput_stops_growing_twice_in_a_row():
    table = {1: _level(1, 100), 2: _level(2, 180), 3: _level(3, 175), 4: _level(4, 250), 6: _level(6, 260),
             8: _level(8, 255), 16: _level(16, 300)}
    result = sweep(lambda c: table[c], [1, 2, 3, 4, 6, 8, 16], progress=None)
    # c=3 dips (one flat level: go on), c=4 grows, c=6 and c=8 stay within 5% of 250: stop
    assert [s.concurrency for s in result.levels] == [1, 2, 3, 4, 6, 8]
    assert "5% at 2 levels" in result.stop_reason
    once = sweep(lambda c: table[c], [1, 2, 3, 4, 6, 8, 16], max_flat=1, progress=None)
    assert [s.concurrency for s in once.levels] == [1, 2, 3]


def test_sweep_stops_when_budget_blown_twice():
    table = {1: _level(1, 100), 2: _level(2, 200, mean=25), 4: _level(4, 400, p99=90), 8: _level(8, 800)}
    result = sweep(lambda c: table[c], [1, 2, 4, 8], progress=None)
    assert [s.concurrency for s in result.levels] == [1, 2, 4]
    assert "budget" in result.stop_reason


def test_capacity_point_is_best_qps_within_budget_and_error_free():
    levels = [_level(1, 100), _level(2, 190, mean=19.9, p99=79.9), _level(4, 300, mean=20.0),
              _level(8, 250, errors={"grpc.RESOURCE_EXHAUSTED": 3}), _level(16, 150, p99=80.0)]
    assert capacity_point(levels).concurrency == 2
    assert capacity_point([_level(1, 10, mean=30)]) is None
    assert loadgen.Sweep(levels, "x").to_dict()["capacity"]["qps"] == 190
