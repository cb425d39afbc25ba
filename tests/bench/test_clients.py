"""Load from several client processes (bench/clients.py): the split of the load, the merge of
records, a real multi-process closed and open loop on fake targets, bounds on a hung process."""

import multiprocessing
import time

import pytest

from boundgen.bench import clients, loadgen
from boundgen.bench.clients import ClientPool, TargetSpec, merge_runs, split_concurrency, split_rate
from boundgen.bench.http_client import HttpTarget
from boundgen.bench.loadgen import LevelRun, Record, summarize

from tests.bench.client_fakes import BrokenTarget, Req, SleepTarget, StopTarget, clock_now
from tests.bench.fake_kserve_http import FakeServer

POOL = [Req(i) for i in range(8)]


def test_concurrency_split_over_processes():
    assert split_concurrency(5, 4) == [2, 1, 1, 1]
    assert split_concurrency(8, 4) == [2, 2, 2, 2]
    assert split_concurrency(2, 4) == [1, 1]  # never more processes than in-flight requests
    assert split_concurrency(1, 1) == [1]
    assert sum(split_concurrency(63, 8)) == 63
    assert split_rate(10.0, 4) == [2.5] * 4
    with pytest.raises(ValueError):
        split_concurrency(0, 4)


def test_default_client_procs_follow_the_cores(monkeypatch):
    monkeypatch.setattr(clients, "available_cores", lambda: set(range(2)))
    assert clients.default_client_procs() == 1
    monkeypatch.setattr(clients, "available_cores", lambda: set(range(12)))
    assert clients.default_client_procs() == 6
    monkeypatch.setattr(clients, "available_cores", lambda: set(range(64)))
    assert clients.default_client_procs() == 8


def test_merged_records_summarize_as_one_process():
    recs = [Record(i, start=10.0 + 0.01 * i, end=10.0 + 0.01 * i + 0.001 * (1 + i % 7), samples=3)
            for i in range(200)]
    window = (10.2, 11.5)
    whole = summarize(recs, window, concurrency=4)
    halves = [LevelRun(recs[0::2], (10.2, 11.9), 1), LevelRun(recs[1::2], (10.1, 11.5), 0)]
    merged = merge_runs(halves, "closed")
    assert merged.window == window and merged.unfinished == 1
    assert summarize(merged.records, merged.window, concurrency=4) == whole
    opened = merge_runs(halves, "open")
    assert opened.window == (10.1, 11.9)


def test_the_clock_compares_across_processes():
    ctx = multiprocessing.get_context("spawn")
    with ctx.Pool(1) as pool:
        before = loadgen.Clock().now()
        theirs = pool.apply(clock_now)
        after = loadgen.Clock().now()
    assert before <= theirs <= after


def test_closed_loop_over_processes_matches_one_process():
    one = loadgen.closed_loop(SleepTarget(0.002), POOL, 4, duration_s=0.3, warmup_s=0.05, progress=None)
    with ClientPool(TargetSpec(SleepTarget, {"delay_s": 0.002}), POOL, 3, work_of=lambda r: 0.001,
                    progress=None) as pool:
        many = pool.closed_loop(4, duration_s=0.3, warmup_s=0.05)
        again = pool.closed_loop(2, duration_s=0.2, warmup_s=0.05)  # the processes serve level after level
    assert many.concurrency == 4 and many.mode == "closed"
    assert many.completed > 50 and not many.errors and many.unfinished == 0
    assert 0.2 < many.window_s < 0.45
    assert many.mean_ms >= 2.0 and many.effective_mfu == pytest.approx(many.qps * 0.001)
    assert 0.3 * one.qps < many.qps < 3.0 * one.qps  # same target, same concurrency (loose: shared cores)
    assert again.concurrency == 2 and again.completed > 0


def test_open_loop_over_processes():
    with ClientPool(TargetSpec(SleepTarget, {"delay_s": 0.001}), POOL, 2, progress=None) as pool:
        stats = pool.open_loop(200.0, duration_s=0.3, seed=3)
    assert stats.mode == "open" and stats.rate == 200.0
    expected = sum(len(loadgen.poisson_arrivals(100.0, 0.3, clients.child_seed(3, k))) for k in range(2))
    assert stats.completed + stats.unfinished == expected and not stats.errors


def test_closed_loop_over_processes_against_an_http_server():
    with FakeServer() as server:
        with ClientPool(TargetSpec(HttpTarget, {"address": server.address, "model": "m", "task": "score"}),
                        POOL, 2, progress=None) as pool:
            stats = pool.closed_loop(3, duration_s=0.3, warmup_s=0.05)
        assert stats.completed > 0 and not stats.errors
        assert server.connections == 3  # one keep-alive connection per in-flight slot


def test_a_hung_process_is_killed_and_counted_unfinished():
    lines = []
    with ClientPool(TargetSpec(StopTarget), POOL, 2, kill_grace_s=0.5, progress=lines.append) as pool:
        t0 = time.monotonic()
        stats = pool.closed_loop(3, duration_s=0.2, warmup_s=0.0, hang_grace_s=0.3)
        elapsed = time.monotonic() - t0
    assert elapsed < 0.2 + 0.3 + 1.0 + 0.5 + 1.5  # the level's time, its grace, the kill grace, slack
    assert stats.completed == 0 and stats.unfinished == 3
    assert sum("killed" in line for line in lines) == 2


def test_a_target_that_cannot_be_built_fails_the_pool():
    with pytest.raises(RuntimeError, match="no such server"):
        ClientPool(TargetSpec(BrokenTarget), POOL, 1, progress=None)


def test_check_clients_doubles_the_processes():
    spec = TargetSpec(SleepTarget, {"delay_s": 0.002})
    with ClientPool(spec, POOL, 2, progress=None) as pool:
        level = pool.closed_loop(4, duration_s=0.3, warmup_s=0.05)
    check = clients.check_clients(spec, POOL, level, 2, progress=None, duration_s=0.3, warmup_s=0.05)
    assert (check["concurrency"], check["procs"], check["procs_2x"]) == (4, 2, 4)
    assert check["qps"] == level.qps and check["qps_2x"] > 0
    assert check["ok"] == (abs(check["change"]) < 3.0)
    skipped = clients.check_clients(spec, POOL, level, 4, progress=None)
    assert skipped["skipped"].startswith("c=4 leaves no room")
