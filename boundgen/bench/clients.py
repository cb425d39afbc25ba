"""Load from several client processes, so that the load generator is never the bottleneck (one
Python process with threads capped a gRPC W2 bench at ~278 QPS where four processes reached ~366).

Data flow: `ClientPool(target_spec, requests, procs)` spawns `procs` processes ('spawn' context:
nothing is forked after a gRPC channel exists). Each builds its own target from the picklable
`TargetSpec` (a module-level class or function and its kwargs: a gRPC channel, HTTP connections
or a fake), keeps its copy of the request pool (rotated, so that the processes do not send the
same request at the same moment) and waits for jobs. A level splits its load over the processes
(closed loop: the concurrency, c=5 over 4 -> 2,1,1,1, never more processes than c; open loop: the
rate evenly, each process its own seeded Poisson stream), sends every process the same start time
on loadgen's Clock (CLOCK_MONOTONIC on Linux: one clock for every process of the host), and each
runs loadgen.run_closed / run_open and sends back its raw records and window. The parent merges
them (`merge_runs`) and summarizes with loadgen.summarize over one common window, as for a
single process. A process that does not answer within the level's time plus `kill_grace_s` is
killed, its load counted as unfinished, and a fresh one takes its place at the next level.

`check_clients` reruns a level with twice the processes: if QPS moves by 3% or more, the
generator, not the target, may have set the number.
"""

from __future__ import annotations

import math
import multiprocessing
import multiprocessing.connection
import os
from dataclasses import dataclass, field
from typing import Callable, Sequence

from boundgen.bench import loadgen
from boundgen.bench.host import available_cores

CHECK_TOLERANCE_PCT = 3.0


@dataclass(frozen=True)
class TargetSpec:
    """How a client process builds its target: `factory(**kwargs)`; the factory is pickled by
    reference, so it must be importable (a module-level class or function)."""
    factory: Callable
    kwargs: dict = field(default_factory=dict)

    def build(self) -> Callable:
        return self.factory(**self.kwargs)


@dataclass(frozen=True)
class ClientSetup:
    """What run_system needs to drive a target from client processes."""
    target: TargetSpec
    procs: int
    check: bool = False  # rerun the capacity level with 2x the processes (check_clients)


@dataclass(frozen=True)
class _Job:
    kind: str  # "closed" | "open"
    load: float  # closed: concurrency; open: rate
    start_at: float  # loadgen.Clock seconds
    kwargs: dict  # for loadgen.run_closed / run_open


@dataclass(frozen=True)
class _Reply:
    """A client process's answer (child -> parent): "ready" once its target is built, "done" with a
    level's run, or "error" with why its build or level failed."""

    status: str  # "ready" | "done" | "error"
    run: loadgen.LevelRun | None = None
    error: str = ""


@dataclass
class _Child:
    process: multiprocessing.Process
    conn: multiprocessing.connection.Connection


def default_client_procs() -> int:
    """Half the cores this process may use (the rest for its threads and the system), 1 to 8."""
    return min(8, max(1, len(available_cores()) // 2))


def split_concurrency(concurrency: int, procs: int) -> list[int]:
    """c in-flight slots over at most `procs` processes, as even as it goes: (5, 4) -> [2, 1, 1, 1]."""
    if concurrency <= 0 or procs <= 0:
        raise ValueError(f"need a positive concurrency and process count, got {concurrency}, {procs}")
    n = min(procs, concurrency)
    base, extra = divmod(concurrency, n)
    return [base + 1] * extra + [base] * (n - extra)


def split_rate(rate: float, procs: int) -> list[float]:
    if rate <= 0 or procs <= 0:
        raise ValueError(f"need a positive rate and process count, got {rate}, {procs}")
    return [rate / procs] * procs


def child_seed(seed: int, k: int) -> int:
    """Process k's Poisson seed: the level's own for the first, so one process repeats a thread run."""
    return seed + 1_000_003 * k


def merge_runs(runs: Sequence[loadgen.LevelRun], mode: str) -> loadgen.LevelRun:
    """One LevelRun from several processes' runs of the same level. Closed loop: the window every
    process measured through (latest start, earliest end); open loop: first arrival to last completion."""
    records = [r for run in runs for r in run.records]
    unfinished = sum(run.unfinished for run in runs)
    if not runs:
        return loadgen.LevelRun([], (0.0, 0.0), 0)
    if mode == "closed":
        window = (max(run.window[0] for run in runs), min(run.window[1] for run in runs))
    else:
        window = (min(run.window[0] for run in runs), max(run.window[1] for run in runs))
    return loadgen.LevelRun(records, window, unfinished)


def _child_main(conn, target: TargetSpec, requests: list, works: list | None, offset: int) -> None:
    """A client process: build the target, then run levels until told to stop (None) or orphaned."""
    try:
        call = target.build()
        pool = requests[offset:] + requests[:offset]
        work_of = None
        if works is not None:  # the parent computed each request's work: look it up by object
            by_id = {id(r): w for r, w in zip(pool, works[offset:] + works[:offset])}
            work_of = lambda request: by_id[id(request)]  # noqa: E731
        conn.send(_Reply("ready"))
    except Exception as exc:
        conn.send(_Reply("error", error=f"{type(exc).__name__}: {exc}"))
        os._exit(1)
    clock = loadgen.Clock()
    while True:
        try:
            job = conn.recv()
        except (EOFError, OSError):  # the parent is gone
            break
        if job is None:
            break
        clock.sleep_until(job.start_at)
        try:
            run_level = loadgen.run_closed if job.kind == "closed" else loadgen.run_open
            load = int(job.load) if job.kind == "closed" else job.load
            run = run_level(call, pool, load, clock=clock, work_of=work_of, progress=None, **job.kwargs)
            conn.send(_Reply("done", run))
        except Exception as exc:
            conn.send(_Reply("error", error=f"{type(exc).__name__}: {exc}"))
    close = getattr(call, "close", None)
    if close:
        try:
            close()
        except Exception:
            pass
    os._exit(0)  # a thread stuck inside the target must not hold up (or abort) the exit


class ClientPool:
    """`procs` client processes over one target and request pool; levels as loadgen runs them."""

    def __init__(self, target: TargetSpec, requests: Sequence, procs: int, *, work_of: Callable | None = None,
                 start_timeout_s: float = 120.0, kill_grace_s: float = 5.0, lead_s: float = 0.2,
                 context: str = "spawn", progress: Callable | None = loadgen.stderr_progress):
        if procs <= 0 or not requests:
            raise ValueError("a client pool needs at least one process and a non-empty request pool")
        self.target, self.requests, self.procs = target, list(requests), procs
        self.works = [work_of(r) for r in self.requests] if work_of else None
        self.start_timeout_s, self.kill_grace_s, self.lead_s = start_timeout_s, kill_grace_s, lead_s
        self.progress = progress
        self.clock = loadgen.Clock()
        self._ctx = multiprocessing.get_context(context)
        self._children: list[_Child | None] = [None] * procs
        try:
            self._start(range(procs))
        except BaseException:
            self.close()
            raise

    def _start(self, indices) -> None:
        """Spawn the children at `indices` and wait until each has built its target."""
        for k in indices:
            parent_end, child_end = self._ctx.Pipe()
            offset = k * len(self.requests) // self.procs
            proc = self._ctx.Process(target=_child_main, args=(child_end, self.target, self.requests, self.works,
                                                               offset), daemon=True, name=f"bench-client-{k}")
            proc.start()
            child_end.close()
            self._children[k] = _Child(proc, parent_end)
        deadline = self.clock.now() + self.start_timeout_s
        for k in indices:
            child = self._children[k]
            ready = child.conn.poll(max(0.0, deadline - self.clock.now()))
            try:
                reply = child.conn.recv() if ready else _Reply("error", error=f"not ready in {self.start_timeout_s:g} s")
            except EOFError:
                reply = _Reply("error", error=f"ended with exit code {child.process.exitcode}")
            if reply.status != "ready":
                raise RuntimeError(f"client process {k} could not build its target: {reply.error}")

    def _kill(self, k: int) -> None:
        child, self._children[k] = self._children[k], None
        if child is None:
            return
        child.process.kill()
        child.process.join(timeout=5.0)
        child.conn.close()

    def _run(self, kind: str, loads: list, kwargs: list[dict], bound_s: float) -> tuple[dict, list[int]]:
        """Every child k with loads[k] runs one level; ({k: LevelRun}, [k lost: killed or failed])."""
        active = [k for k, load in enumerate(loads) if load]
        missing = [k for k in active if self._children[k] is None or not self._children[k].process.is_alive()]
        for k in missing:
            self._kill(k)
        if missing:
            self._start(missing)
        start_at = self.clock.now() + self.lead_s
        runs, pending, lost = {}, set(), []
        for k in active:
            try:
                self._children[k].conn.send(_Job(kind, loads[k], start_at, kwargs[k]))
                pending.add(k)
            except (OSError, ValueError):  # it died since the check above
                self._say(f"client process {k} ended before the level")
                self._kill(k)
                lost.append(k)
        deadline = start_at + bound_s + self.kill_grace_s
        while pending and self.clock.now() < deadline:
            conns = {self._children[k].conn: k for k in pending}
            for conn in multiprocessing.connection.wait(list(conns), timeout=max(0.0, deadline - self.clock.now())):
                k = conns[conn]
                pending.discard(k)
                try:
                    reply = conn.recv()
                except (EOFError, OSError):
                    reply = _Reply("error", error="the client process ended")
                if reply.status == "done":
                    runs[k] = reply.run
                else:
                    lost.append(k)
                    self._say(f"client process {k} failed: {reply.error}")
                    self._kill(k)
        for k in sorted(pending):
            self._say(f"client process {k} did not answer within {bound_s + self.kill_grace_s:.0f} s: killed")
            self._kill(k)
            lost.append(k)
        return runs, lost

    def _say(self, line: str) -> None:
        if self.progress:
            self.progress(f"  WARNING: {line}")

    def closed_loop(self, concurrency: int, *, duration_s: float = 5.0, warmup_s: float = 1.0,
                    max_requests: int = 100_000, min_requests: int = 5, hang_grace_s: float = 30.0,
                    budget: loadgen.LatencyBudget = loadgen.LatencyBudget()) -> loadgen.LevelStats:
        """loadgen.closed_loop's level, its concurrency split over the processes."""
        loads = split_concurrency(concurrency, self.procs)
        kwargs = [dict(duration_s=duration_s, warmup_s=warmup_s, hang_grace_s=hang_grace_s,
                       max_requests=max(1, math.ceil(max_requests * c / concurrency)),
                       min_requests=max(1, math.ceil(min_requests * c / concurrency))) for c in loads]
        runs, lost = self._run("closed", loads, kwargs, warmup_s + duration_s + hang_grace_s + 1.0)
        run = merge_runs(list(runs.values()), "closed")
        return loadgen.summarize(run.records, run.window, mode="closed", concurrency=concurrency,
                                 unfinished=run.unfinished + sum(loads[k] for k in lost), budget=budget,
                                 with_mfu=self.works is not None)

    def open_loop(self, rate: float, *, duration_s: float = 5.0, seed: int = 0, max_in_flight: int = 256,
                  drain_s: float = 10.0, budget: loadgen.LatencyBudget = loadgen.LatencyBudget()
                  ) -> loadgen.LevelStats:
        """loadgen.open_loop's level, its rate split evenly, each process its own Poisson stream."""
        loads = split_rate(rate, self.procs)
        kwargs = [dict(duration_s=duration_s, seed=child_seed(seed, k), drain_s=drain_s,
                       max_in_flight=max(1, math.ceil(max_in_flight / self.procs))) for k in range(self.procs)]
        runs, lost = self._run("open", loads, kwargs, duration_s + drain_s + 1.0)
        run = merge_runs(list(runs.values()), "open")
        lost_arrivals = sum(len(loadgen.poisson_arrivals(loads[k], duration_s, kwargs[k]["seed"])) for k in lost)
        return loadgen.summarize(run.records, run.window, mode="open", rate=rate,
                                 unfinished=run.unfinished + lost_arrivals, budget=budget,
                                 with_mfu=self.works is not None)

    def close(self) -> None:
        """Tell every child to stop; kill those still there after a moment."""
        for child in self._children:
            if child is not None:
                try:
                    child.conn.send(None)
                except (OSError, ValueError):
                    pass
        for k, child in enumerate(self._children):
            if child is not None:
                child.process.join(timeout=2.0)
                self._kill(k)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def check_clients(target: TargetSpec, requests: Sequence, level: loadgen.LevelStats, procs: int, *,
                  work_of: Callable | None = None, progress: Callable | None = loadgen.stderr_progress,
                  **level_kwargs) -> dict:
    """Rerun closed-loop `level` (measured with `procs` processes) with twice the processes, at
    most one per in-flight request: {concurrency, procs, qps, procs_2x, qps_2x, change (%), ok}, or
    {concurrency, procs, skipped} where the level leaves no room for more processes."""
    c = level.concurrency
    used = min(procs, c)
    doubled = min(2 * used, c)
    if doubled <= used:
        return {"concurrency": c, "procs": used, "skipped": f"c={c} leaves no room for more than {used} "
                                                           "client processes"}
    with ClientPool(target, requests, doubled, work_of=work_of, progress=progress) as pool:
        again = pool.closed_loop(c, **level_kwargs)
    change = 100.0 * (again.qps - level.qps) / level.qps if level.qps else float("inf")
    return {"concurrency": c, "procs": used, "qps": level.qps, "procs_2x": doubled, "qps_2x": again.qps,
            "change": change, "ok": abs(change) < CHECK_TOLERANCE_PCT}
