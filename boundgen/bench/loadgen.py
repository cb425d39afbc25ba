"""Load generator: closed loop at fixed concurrency, open loop (Poisson), the sweep, the capacity point.

The target is any callable `request -> result` (an in-process engine, a gRPC client, the HF peer).
A result may carry `timings` {"pre", "model", "post"} in seconds; queue time is the rest of the
end-to-end latency. An exception from the callable counts as an error under its name (a gRPC
error under its status code, an HTTP one under its status).

Measurement: closed loop keeps `concurrency` requests in flight (a worker sends the next request
as soon as its previous one returns). Requests completing during the warmup are dropped; the
window then runs for `duration_s` or until `max_requests` completions, whichever comes first,
but at least until `min_requests` completed (a slow target), for at most `hang_grace_s` more.
Statistics cover the requests that completed inside the window; QPS = completions / window.
Open loop sends requests at Poisson arrival times (seeded) regardless of completions; a
request's latency runs from its scheduled arrival (client-side waiting included), and the window
runs from the first arrival until the last completion, at most `drain_s` after the last arrival.
Percentiles are nearest-rank. Every level is bounded in time and count; a callable that hangs
is abandoned (its worker thread is a daemon) and counted as unfinished.

`run_closed` and `run_open` return a level's raw records and window (`LevelRun`); `closed_loop`
and `open_loop` summarize them. Several client processes (bench/clients.py) each run one and the
parent summarizes the merged records: `Clock` reads time.perf_counter, which is the system-wide
CLOCK_MONOTONIC on Linux, so times from different processes compare.
"""

from __future__ import annotations

import math
import queue
import sys
import threading
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from typing import Callable, Sequence

import numpy as np


@dataclass(frozen=True)
class LatencyBudget:
    mean_ms: float = 20.0
    p99_ms: float = 80.0


@dataclass
class Record:
    request_index: int
    start: float  # seconds, clock time the request was sent (open loop: scheduled arrival)
    end: float
    samples: int = 1
    work: float = 0.0  # the request's seconds at peak (mfu.RequestFlops.peak_seconds); sums to MFU
    timings: dict = field(default_factory=dict)
    error: str | None = None


@dataclass
class LevelStats:
    mode: str  # "closed" | "open"
    concurrency: int | None
    rate: float | None  # open loop: offered requests per second
    window_s: float
    completed: int
    errors: dict
    unfinished: int
    qps: float
    samples_per_s: float
    mean_ms: float | None
    p50_ms: float | None
    p99_ms: float | None
    max_ms: float | None
    breakdown_ms: dict | None  # mean "pre", "model", "post", "queue" (and "requests_per_call") over requests;
    #                            served: also "link" (front end <-> engine process), "rpc" (client to server
    #                            handler and back), "server_other" (the handler's own protocol work)
    #                            that report timings
    effective_mfu: float | None
    within_budget: bool

    def to_dict(self) -> dict:
        return asdict(self)

    def line(self) -> str:
        what = f"c={self.concurrency}" if self.mode == "closed" else f"rate={self.rate:g}/s"
        if not self.completed:
            return f"{what}: no request completed ({sum(self.errors.values())} errors, {self.unfinished} unfinished)"
        err = f" errors={sum(self.errors.values())}" if self.errors else ""
        mfu = f" mfu={100 * self.effective_mfu:.1f}%" if self.effective_mfu is not None else ""
        return (f"{what}: {self.qps:.1f} QPS, {self.samples_per_s:.0f} samples/s, mean {self.mean_ms:.1f} ms, "
                f"p50 {self.p50_ms:.1f} ms, p99 {self.p99_ms:.1f} ms{mfu}{err}")


def nearest_rank(sorted_values: Sequence[float], p: float) -> float:
    """The p-th percentile by nearest rank: the ceil(p/100 * n)-th smallest value."""
    n = len(sorted_values)
    return float(sorted_values[max(1, math.ceil(p / 100.0 * n)) - 1])


def summarize(records: Sequence[Record], window: tuple[float, float], *, mode: str = "closed",
              concurrency: int | None = None, rate: float | None = None, unfinished: int = 0,
              budget: LatencyBudget = LatencyBudget(), with_mfu: bool = False) -> LevelStats:
    """Statistics of the records that ended inside `window` (start, end in clock seconds)."""
    t0, t1 = window
    span = max(t1 - t0, 1e-9)
    inside = [r for r in records if t0 <= r.end <= t1]
    ok = [r for r in inside if r.error is None]
    errors = dict(Counter(r.error for r in inside if r.error is not None))
    lat = sorted((r.end - r.start) * 1e3 for r in ok)
    stats = dict(mean_ms=None, p50_ms=None, p99_ms=None, max_ms=None)
    if lat:
        stats = dict(mean_ms=float(np.mean(lat)), p50_ms=nearest_rank(lat, 50), p99_ms=nearest_rank(lat, 99),
                     max_ms=lat[-1])
    timed = [r for r in ok if r.timings]
    breakdown = None
    if timed:
        parts = {k: float(np.mean([r.timings.get(k, 0.0) for r in timed]) * 1e3) for k in ("pre", "model", "post")}
        e2e = float(np.mean([r.end - r.start for r in timed]) * 1e3)
        breakdown = {**parts, "queue": e2e - sum(parts.values())}
        served = [r for r in timed if "handler" in r.timings]
        if served:  # a server's own timings: the rest of queue is the link to its engine process and the RPC
            mean = {k: float(np.mean([r.timings.get(k, 0.0) for r in served]) * 1e3) for k in ("queue", "link",
                                                                                               "handler")}
            breakdown.update(queue=mean["queue"], link=mean["link"],
                             rpc=float(np.mean([r.end - r.start for r in served]) * 1e3) - mean["handler"],
                             server_other=mean["handler"] - sum(parts.values()) - mean["queue"] - mean["link"])
        calls = [r.timings["batch_requests"] for r in timed if "batch_requests" in r.timings]
        if calls:  # requests in the call a request rode in (request-weighted: what a request sees)
            breakdown["requests_per_call"] = float(np.mean(calls))
    within = bool(lat) and stats["mean_ms"] < budget.mean_ms and stats["p99_ms"] < budget.p99_ms
    return LevelStats(
        mode=mode, concurrency=concurrency, rate=rate, window_s=span, completed=len(ok), errors=errors,
        unfinished=unfinished, qps=len(ok) / span, samples_per_s=sum(r.samples for r in ok) / span, **stats,
        breakdown_ms=breakdown, effective_mfu=(sum(r.work for r in ok) / span) if with_mfu else None,
        within_budget=within)


@dataclass
class LevelRun:
    """One level's raw outcome, before statistics: every record kept, the measurement window
    (clock seconds) and the requests still in flight when the level gave up on them."""
    records: list  # [Record]
    window: tuple[float, float]
    unfinished: int


def error_name(exc: BaseException) -> str:
    status = getattr(exc, "http_status", None)
    if status is not None:  # bench.http_client.HttpError
        return f"http.{status}"
    code = getattr(exc, "code", None)
    if callable(code):  # grpc.RpcError
        try:
            return f"grpc.{code().name}"
        except Exception:
            pass
    return type(exc).__name__


class Clock:
    """Monotonic time; tests pass a fake one."""

    def now(self) -> float:
        return time.perf_counter()

    def sleep_until(self, t: float) -> None:
        delay = t - self.now()
        if delay > 0:
            time.sleep(delay)


def stderr_progress(line: str) -> None:
    print(f"[bench] {line}", file=sys.stderr, flush=True)


def _issue(call, request, index: int, clock: Clock, work_of, start: float | None = None) -> Record:
    t0 = clock.now() if start is None else start
    error, timings = None, {}
    try:
        result = call(request)
        timings = dict(getattr(result, "timings", None) or {})
    except Exception as exc:  # the target's failure is data, not a crash of the bench
        error = error_name(exc)
    return Record(index, t0, clock.now(), getattr(request, "samples", 1), work_of(request) if work_of else 0.0,
                  timings, error)


def closed_loop(call: Callable, requests: Sequence, concurrency: int, *, duration_s: float = 5.0,
                warmup_s: float = 1.0, max_requests: int = 100_000, min_requests: int = 5,
                clock: Clock | None = None,
                work_of: Callable | None = None, budget: LatencyBudget = LatencyBudget(),
                progress: Callable | None = stderr_progress, progress_every_s: float = 2.0,
                hang_grace_s: float = 30.0) -> LevelStats:
    """One closed-loop level: `concurrency` workers, each sending requests back to back."""
    run = run_closed(call, requests, concurrency, duration_s=duration_s, warmup_s=warmup_s,
                     max_requests=max_requests, min_requests=min_requests, clock=clock, work_of=work_of,
                     progress=progress, progress_every_s=progress_every_s, hang_grace_s=hang_grace_s)
    return summarize(run.records, run.window, mode="closed", concurrency=concurrency, unfinished=run.unfinished,
                     budget=budget, with_mfu=work_of is not None)


def run_closed(call: Callable, requests: Sequence, concurrency: int, *, duration_s: float = 5.0,
               warmup_s: float = 1.0, max_requests: int = 100_000, min_requests: int = 5,
               clock: Clock | None = None, work_of: Callable | None = None,
               progress: Callable | None = stderr_progress, progress_every_s: float = 2.0,
               hang_grace_s: float = 30.0) -> LevelRun:
    """closed_loop's records and window, unsummarized."""
    if concurrency <= 0 or not requests:
        raise ValueError("closed loop needs concurrency >= 1 and a non-empty request pool")
    clock = clock or Clock()
    lock, stop = threading.Lock(), threading.Event()
    records: list[Record] = []
    state = {"next": 0, "in_window": 0, "in_limit": 0, "window_end": None, "latest_end": float("-inf")}
    begin = clock.now()
    window_start, window_limit = begin + warmup_s, begin + warmup_s + duration_s

    def worker():
        while not stop.is_set():
            with lock:
                i = state["next"]
                state["next"] += 1
            rec = _issue(call, requests[i % len(requests)], i, clock, work_of)
            with lock:
                if stop.is_set():
                    return
                records.append(rec)
                if rec.end >= window_start:
                    state["in_window"] += 1
                    state["in_limit"] += rec.end <= window_limit
                    # Workers reach this lock in any order: a record counted earlier may have ended later.
                    state["latest_end"] = max(state["latest_end"], rec.end)
                end = None
                if state["in_window"] >= max_requests:
                    end = state["latest_end"]  # every counted record ends inside the window
                elif rec.end > window_limit:
                    if state["in_limit"] >= min_requests:
                        end = window_limit
                    elif state["in_window"] >= min_requests:
                        end = rec.end  # slow target: the window stretches to min_requests completions
                if end is not None:
                    state["window_end"] = end
                    stop.set()

    threads = [threading.Thread(target=worker, daemon=True, name=f"bench-c{concurrency}-{k}")
               for k in range(concurrency)]
    for t in threads:
        t.start()
    real_deadline = time.monotonic() + warmup_s + duration_s + hang_grace_s
    while not stop.wait(progress_every_s):
        if progress:
            with lock:
                done = len(records)
            progress(f"  c={concurrency}: {done} done, {clock.now() - begin:.1f}s")
        if time.monotonic() > real_deadline:
            break
    stop.set()
    for t in threads:
        t.join(timeout=max(0.0, real_deadline - time.monotonic()) + 1.0)
    unfinished = sum(t.is_alive() for t in threads)
    with lock:
        window_end = state["window_end"] if state["window_end"] is not None else clock.now()
        recs = list(records)
    return LevelRun(recs, (window_start, window_end), unfinished)


@dataclass(frozen=True)
class _Arrival:
    """An open-loop request handed to a sending thread: the request's index and when it was due."""

    index: int
    scheduled: float  # Clock seconds


def poisson_arrivals(rate: float, duration_s: float, seed: int = 0) -> np.ndarray:
    """Arrival offsets in seconds, [0, duration_s), of a Poisson process of `rate` per second."""
    if rate <= 0 or duration_s <= 0:
        raise ValueError(f"open loop needs a positive rate and duration, got rate={rate} duration={duration_s}")
    rng = np.random.default_rng(seed)
    n = int(rate * duration_s * 1.5 + 20)
    t = np.cumsum(rng.exponential(1.0 / rate, size=n))
    while t[-1] < duration_s:  # rare: draw more
        t = np.concatenate([t, t[-1] + np.cumsum(rng.exponential(1.0 / rate, size=n))])
    return t[t < duration_s]


def open_loop(call: Callable, requests: Sequence, rate: float, *, duration_s: float = 5.0, seed: int = 0,
              max_in_flight: int = 256, drain_s: float = 10.0, clock: Clock | None = None,
              work_of: Callable | None = None, budget: LatencyBudget = LatencyBudget(),
              progress: Callable | None = stderr_progress) -> LevelStats:
    """One open-loop level: Poisson arrivals at `rate`; at most `max_in_flight` requests being sent
    at once (beyond that, arrivals wait in the client and that wait counts in their latency)."""
    run = run_open(call, requests, rate, duration_s=duration_s, seed=seed, max_in_flight=max_in_flight,
                   drain_s=drain_s, clock=clock, work_of=work_of, progress=progress)
    return summarize(run.records, run.window, mode="open", rate=rate, unfinished=run.unfinished, budget=budget,
                     with_mfu=work_of is not None)


def run_open(call: Callable, requests: Sequence, rate: float, *, duration_s: float = 5.0, seed: int = 0,
             max_in_flight: int = 256, drain_s: float = 10.0, clock: Clock | None = None,
             work_of: Callable | None = None, progress: Callable | None = stderr_progress) -> LevelRun:
    """open_loop's records and window, unsummarized."""
    clock = clock or Clock()
    arrivals = poisson_arrivals(rate, duration_s, seed)
    todo: queue.Queue[_Arrival | None] = queue.Queue()  # None: no more arrivals
    lock = threading.Lock()
    records: list[Record] = []
    begin = clock.now()

    def worker():
        while True:
            item = todo.get()
            if item is None:
                return
            rec = _issue(call, requests[item.index % len(requests)], item.index, clock, work_of, start=item.scheduled)
            with lock:
                records.append(rec)

    threads = [threading.Thread(target=worker, daemon=True, name=f"bench-open-{k}")
               for k in range(min(max_in_flight, len(arrivals)) or 1)]
    for t in threads:
        t.start()
    for i, offset in enumerate(arrivals):
        clock.sleep_until(begin + offset)
        todo.put(_Arrival(i, begin + offset))
        if progress and i and i % max(1, int(rate * 2)) == 0:
            with lock:
                done = len(records)
            progress(f"  rate={rate:g}/s: {i} sent, {done} done")
    for _ in threads:
        todo.put(None)
    drain_deadline = time.monotonic() + (begin + duration_s - clock.now()) + drain_s
    for t in threads:
        t.join(timeout=max(0.0, drain_deadline - time.monotonic()))
    with lock:
        recs = list(records)
    unfinished = len(arrivals) - len(recs)
    end = max([r.end for r in recs], default=clock.now())
    return LevelRun(recs, (begin, end), unfinished)


@dataclass
class Sweep:
    levels: list  # [LevelStats], ascending concurrency
    stop_reason: str

    def to_dict(self) -> dict:
        cap = capacity_point(self.levels)
        return {"levels": [s.to_dict() for s in self.levels], "stop_reason": self.stop_reason,
                "capacity": cap.to_dict() if cap else None}


def sweep(run_level: Callable[[int], LevelStats], concurrencies: Sequence[int], *, min_growth: float = 0.05,
          max_flat: int = 2, max_blown: int = 2, progress: Callable | None = stderr_progress) -> Sweep:
    """Run levels in order until throughput grows by no more than `min_growth` over the best so far
    at `max_flat` levels in a row, or the latency budget is blown at `max_blown` levels, or the
    levels run out. (One flat level is not enough: a 2 s level's QPS varies by a few percent, and a
    single dip stopped sweeps below their peak on the H200, 2026-12-01.)"""
    levels, blown, flat, best = [], 0, 0, 0.0
    for c in concurrencies:
        if progress:
            progress(f"closed loop c={c}")
        stats = run_level(c)
        levels.append(stats)
        if progress:
            progress("  " + stats.line())
        blown += not stats.within_budget
        if blown >= max_blown:
            return Sweep(levels, f"latency budget blown at {blown} levels")
        flat = flat + 1 if len(levels) > 1 and stats.qps <= best * (1.0 + min_growth) else 0
        if flat >= max_flat:
            return Sweep(levels, f"throughput grew by <= {100 * min_growth:g}% at {flat} levels up to c={c}")
        best = max(best, stats.qps)
    return Sweep(levels, "all concurrency levels run")


def capacity_point(levels: Sequence[LevelStats]) -> LevelStats | None:
    """The highest-QPS level with mean < 20 ms and P99 < 80 ms (the budget) and no errors."""
    ok = [s for s in levels if s.within_budget and not s.errors and not s.unfinished]
    return max(ok, key=lambda s: s.qps, default=None)
