"""One system (boundgen or the peer) under one workload: warm, sweep, optional open loop.

Glue between workloads, loadgen and mfu; bench/orchestrate.py decides what to run and where results go.
A system that fails is recorded with its error and the bench carries on with the next one.
Levels run on threads of this process, or, given a `clients.ClientSetup` (a server over gRPC or
HTTP), from that many client processes (bench/clients.py), which then also check themselves.
"""

from __future__ import annotations

import json

import datetime
import platform
import subprocess
import traceback
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Callable, Sequence

from boundgen.artifact.tasks import task_named
from boundgen.bench import clients, loadgen, mfu
from boundgen.bench.grpc_client import GrpcTarget
from boundgen.bench.http_client import HttpTarget
from boundgen.bench.tasks import bench_task
from boundgen.bench.workloads import Request, WorkloadSpec


@dataclass(frozen=True)
class BenchConfig:
    concurrencies: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64)
    duration_s: float = 5.0  # measured seconds per level (and of the open-loop run)
    warmup_s: float = 1.0  # per level, not measured
    max_requests: int = 20_000  # per level
    open_loop_rate: float | str | None = None  # requests/s, "auto" = 1.2 x best closed-loop QPS, None = off
    seed: int = 0
    budget: loadgen.LatencyBudget = loadgen.LatencyBudget()

    def __post_init__(self):
        if not self.concurrencies or any(c <= 0 for c in self.concurrencies):
            raise ValueError(f"concurrency levels must be positive integers, got {self.concurrencies}")
        if self.duration_s <= 0 or self.warmup_s < 0 or self.max_requests <= 0:
            raise ValueError("duration and max requests must be positive, warmup non-negative")


def engine_call(engine, spec: WorkloadSpec) -> Callable:
    """The load generator's callable over an in-process `Engine`."""
    task = task_named(spec.task)
    return lambda request: task.call(engine, request.texts)


def request_flops(spec: WorkloadSpec, shape: mfu.ModelShape, request: Request) -> mfu.RequestFlops:
    return bench_task(spec.task).flops(shape, spec, request)


def work_function(spec: WorkloadSpec, shape: mfu.ModelShape, fp8_groups: Sequence[str] = (),
                  peaks: dict | None = mfu.H200_PEAKS) -> Callable | None:
    """request -> its seconds at the device's peak (summed over a window and divided by it: effective
    MFU); None where the device's peak is not known (`peaks` None: no MFU is reported)."""
    if peaks is None:
        return None
    cache: dict = {}

    def work(request: Request) -> float:
        key = request.token_counts
        if key not in cache:
            cache[key] = request_flops(spec, shape, request).peak_seconds(fp8_groups, peaks)
        return cache[key]

    return work


def device_name(engine=None) -> str | None:
    """The GPU an in-process engine runs on ("cpu" for a CPU engine); for a remote target, this host's
    first GPU (the bench runs beside the server it measures), None without one."""
    device = str(getattr(getattr(engine, "spec", None), "device", "cuda"))
    if not device.startswith("cuda"):
        return "cpu"
    try:
        import torch  # lazily: the bench of a remote server runs without it where it is not installed

        return torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
    except ImportError:
        return None


def run_system(call: Callable, requests: Sequence[Request], cfg: BenchConfig, *, target: str,
               work_of: Callable | None = None, progress: Callable | None = loadgen.stderr_progress,
               on_update: Callable[[dict], None] | None = None,
               client_setup: clients.ClientSetup | None = None) -> dict:
    """Warm up, sweep concurrency, [check the client processes at the capacity point], then the
    open-loop run if asked. `call` serves the warm-up (and every level without `client_setup`).
    Never raises for the target's failures: they end up in "error". `on_update(partial)` is
    called after every level, so that an interrupted run (Ctrl-C, a time limit) still leaves its
    finished levels on disk."""
    out = {"target": target, "client_procs": client_setup.procs if client_setup else 1, "sweep": None,
           "open_loop": None, "error": None}
    levels: list = []
    pool = None
    level_kwargs = dict(duration_s=cfg.duration_s, warmup_s=cfg.warmup_s, max_requests=cfg.max_requests,
                        budget=cfg.budget)

    def update():
        if on_update:
            on_update(out)

    def level(c: int) -> loadgen.LevelStats:
        if pool:
            stats = pool.closed_loop(c, **level_kwargs)
        else:
            stats = loadgen.closed_loop(call, requests, c, work_of=work_of, progress=progress, **level_kwargs)
        levels.append(stats)
        out["sweep"] = loadgen.Sweep(list(levels), "interrupted").to_dict()
        update()
        return stats

    try:
        for request in requests[: min(3, len(requests))]:
            call(request)  # first calls pay lazy costs; an engine that cannot serve fails here, readably
        if client_setup:
            if progress:
                progress(f"starting {client_setup.procs} client processes")
            pool = clients.ClientPool(client_setup.target, requests, client_setup.procs, work_of=work_of,
                                      progress=progress)
        sweep = loadgen.sweep(level, cfg.concurrencies, progress=progress)
        out["sweep"] = sweep.to_dict()
        update()
        if client_setup and client_setup.check:
            capacity = loadgen.capacity_point(sweep.levels)
            out["client_check"] = (_check_clients(client_setup, requests, capacity, work_of, progress, level_kwargs)
                                   if capacity else {"skipped": "no level within the latency budget"})
            update()
        rate = open_loop_rate(cfg.open_loop_rate, sweep)
        if rate:
            if progress:
                progress(f"open loop at {rate:.1f} requests/s for {cfg.duration_s:g} s")
            if pool:
                stats = pool.open_loop(rate, duration_s=cfg.duration_s, seed=cfg.seed, budget=cfg.budget)
            else:
                stats = loadgen.open_loop(call, requests, rate, duration_s=cfg.duration_s, seed=cfg.seed,
                                          work_of=work_of, budget=cfg.budget, progress=progress)
            if progress:
                progress("  " + stats.line())
            out["open_loop"] = stats.to_dict()
    except KeyboardInterrupt:
        out["error"] = "interrupted before the end (Ctrl-C or a time limit): the levels shown finished"
        update()
        raise
    except Exception as exc:
        out["error"] = f"{type(exc).__name__}: {exc}"
        out["traceback"] = traceback.format_exc(limit=8)
        if progress:
            progress(f"FAILED: {out['error']}")
    finally:
        if pool:
            pool.close()
    update()
    return out


def _check_clients(setup: clients.ClientSetup, requests, capacity: loadgen.LevelStats, work_of, progress,
                   level_kwargs: dict) -> dict:
    """clients.check_clients at the capacity point, said on the progress line (a warning if it fails)."""
    if progress:
        progress(f"client check: c={capacity.concurrency} again with twice the client processes")
    check = clients.check_clients(setup.target, requests, capacity, setup.procs, work_of=work_of,
                                  progress=progress, **level_kwargs)
    if progress:
        if check.get("skipped"):
            progress(f"  client_check: skipped, {check['skipped']}")
        else:
            progress(f"  client_check: {{procs: {check['procs']}, qps: {check['qps']:.1f}, "
                     f"procs_2x: {check['procs_2x']}, qps_2x: {check['qps_2x']:.1f}, "
                     f"change: {check['change']:+.1f}%, ok: {str(check['ok']).lower()}}}")
            if not check["ok"]:
                progress(f"  WARNING: QPS at c={check['concurrency']} changed by {check['change']:+.1f}% with "
                         f"{check['procs_2x']} client processes instead of {check['procs']}: the load "
                         "generator may be the bottleneck (raise --client-procs, or give the bench more cores)")
    return check


def remote_target(task: str, *, grpc: str | None = None, http: str | None = None, model: str,
                  filters: dict | None = None) -> tuple[clients.TargetSpec, str]:
    """(how a client process builds its target, a description) for a running server's model;
    filters: GrpcTarget's allow_subset / allow_lists (a constrained model's, over gRPC)."""
    if bool(grpc) == bool(http):
        raise ValueError("a remote target is one of grpc or http")
    if filters and not grpc:
        raise ValueError("allow-lists and subsets are sent over gRPC (--grpc)")
    factory, address, kind = (GrpcTarget, grpc, "grpc") if grpc else (HttpTarget, http, "http")
    described = f"{kind} {address} model {model}"
    if filters and filters.get("allow_subset"):
        described += f", subset {filters['allow_subset']}"
    if filters and filters.get("allow_lists"):
        lists = filters["allow_lists"]
        described += f", {len(lists)} distinct allow-lists of {len(lists[0]) // 8:,} items"
    return (clients.TargetSpec(factory, {"address": address, "model": model, "task": task, **(filters or {})}),
            described)


def allow_lists(cat_dir: str, count: int, lists: int, seed: int = 0) -> list[bytes]:
    """`lists` seeded random allow-lists of `count` items of the catalogue in CAT_DIR, as raw
    little-endian int64 (ALLOW_ITEMS): one a request of the pool, each its own."""
    import numpy as np

    from boundgen.bench.constrained import random_allow_list  # lazily: it imports torch
    from boundgen.text.catalogue import Catalogue

    cat = Catalogue.load(cat_dir, verify=False)
    return [np.asarray(random_allow_list(cat, count, seed + i), dtype="<i8").tobytes() for i in range(lists)]


def open_loop_rate(setting, sweep: loadgen.Sweep) -> float | None:
    if setting in (None, "", 0):
        return None
    if setting == "auto":
        best = max((s.qps for s in sweep.levels), default=0.0)
        return 1.2 * best if best > 0 else None
    return float(setting)


def model_shape(spec: WorkloadSpec, dirs: Sequence[str | None]) -> tuple[mfu.ModelShape, str]:
    """Model shape for MFU: the model an artifact records in its manifest, or config.json, of the first
    dir that has one; else the workload's shape."""
    for d in dirs:
        if d and (Path(d) / "manifest.json").is_file():
            config = json.loads((Path(d) / "manifest.json").read_text())["model"]["config"]
            return mfu.ModelShape.of(SimpleNamespace(**config)), f"{d}/manifest.json"
        if d and (Path(d) / "config.json").is_file():
            from boundgen.model.loader import read_config  # imports torch and the ops: only when needed

            return mfu.ModelShape.of(read_config(d)), f"{d}/config.json"
    return mfu.SHAPES[spec.preset], f"workload {spec.name} shape ({spec.preset})"


def workload_header(spec: WorkloadSpec, requests: Sequence[Request], shape: mfu.ModelShape, seed: int,
                    shape_source: str) -> dict:
    flops = [request_flops(spec, shape, r).total for r in requests]
    return {**spec.to_dict(), "pool": len(requests), "seed": seed,
            "mean_tokens_per_request": sum(r.tokens for r in requests) / len(requests),
            "gflops_per_request": sum(flops) / len(flops) / 1e9, "model_shape": vars(shape),
            "model_shape_from": shape_source}


def environment() -> dict:
    env = {"python": platform.python_version()}
    for name in ("torch", "transformers", "triton", "numpy"):
        try:
            env[name] = __import__(name).__version__
        except Exception:
            env[name] = "not installed"
    try:
        import torch

        if torch.cuda.is_available():
            env["device"] = torch.cuda.get_device_name(0)
            env["cuda"] = torch.version.cuda
        else:
            env["device"] = "cpu"
    except Exception:
        pass
    try:
        root = Path(__file__).resolve().parents[2]
        # A `git archive` snapshot names its commit in COMMIT; git would name the checkout around it.
        if (root / "COMMIT").is_file():
            env["commit"] = (root / "COMMIT").read_text().strip()
        else:
            env["commit"] = subprocess.run(["git", "-C", str(root), "rev-parse", "--short", "HEAD"],
                                           capture_output=True, text=True, timeout=5).stdout.strip()
        env["commit"] = env["commit"] or "unknown"
    except Exception:
        env["commit"] = "unknown"
    return env


def now_utc() -> str:
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
