"""A peer measured in its own process: warm every shape it will meet, pick its best setup, sweep.

`boundgen bench --peer DIR --peer-mode eager,compiled` starts one such process per mode after
boundgen's engine is closed, so a peer never shares the device, the allocator or the Python
process with boundgen:
    python3 -m boundgen.bench.peer_process --peer DIR --mode eager --workload W1 --out peer.json
The process regenerates the bench's request pool (same workload, tokenizer, pool size and seed:
the same requests, byte for byte; bench/workloads.py), then for each workload:
1. probe (score only, when more than one padding is offered): each padding with its shapes
   warmed at one request a call, then `probe_requests` requests timed one after another; the
   faster padding is kept (bench/peer.py describes both);
2. warm every (padded length, requests per call) shape the pool can produce, up to
   `max_batch` requests a call; compiled shapes run three times (compile, record the CUDA
   graph, replay);
3. the closed-loop sweep (and the open loop if asked) of bench/runner.py over a Batcher
   (bench/peer_batching.py) that puts up to `max_batch` waiting requests into one call.
Its JSON: {"mode", "workloads": {name: system dict as runner.run_system returns it, plus "setup"}},
rewritten after every level so that an interrupted process leaves what finished.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Sequence

from boundgen.bench import report, runner
from boundgen.bench.peer import MODES, HFPeer, PeerOptions, batch_call
from boundgen.bench.peer_batching import Batcher
from boundgen.bench.tasks import bench_task
from boundgen.bench.workloads import get_workload, load_tokenizer, make_requests


def max_batch_for(mode: str, task: str, requested: int) -> int:
    """The compiled beam peer runs one request a call (bench/peer_compiled.py says why)."""
    return 1 if (mode == "compiled" and bench_task(task).peer_compiled_one_request) else requested


def shape_groups(peer: HFPeer, spec, requests: Sequence) -> dict[int, object]:
    """One representative request per padded length the pool produces (score: the padded
    longest sample; beam: the prompt length)."""
    groups: dict[int, object] = {}
    for r in requests:
        key = bench_task(spec.task).peer_shape(peer, r)
        groups.setdefault(key, r)
    return dict(sorted(groups.items()))


def warm_shapes(peer: HFPeer, spec, requests: Sequence, batcher: Batcher, batch_sizes: Sequence[int]) -> dict:
    """Run every (padded length, requests per call) shape; returns what was warmed and how long it took."""
    repeats = 3 if peer.options.mode == "compiled" else 1
    groups = shape_groups(peer, spec, requests)
    t0, slowest = time.perf_counter(), 0.0
    for n in batch_sizes:
        for request in groups.values():
            for _ in range(repeats):
                t = time.perf_counter()
                batcher.call_batch([request] * n)
                slowest = max(slowest, time.perf_counter() - t)
    return {"lengths": list(groups), "requests_per_call": list(batch_sizes), "repeats": repeats,
            "seconds": time.perf_counter() - t0, "slowest_call_s": slowest}


def time_sequential(batcher: Batcher, requests: Sequence) -> float:
    """Mean ms of one request a call, one after another."""
    t0 = time.perf_counter()
    for r in requests:
        batcher.call_batch([r])
    return (time.perf_counter() - t0) / len(requests) * 1e3


def prepare(peer: HFPeer, spec, requests: Sequence, batcher: Batcher, pads: Sequence[str], max_batch: int,
            probe_requests: int, progress) -> dict:
    """Probe the paddings (score), keep the fastest, warm every shape up to `max_batch` a call."""
    setup: dict = {"probe": {}}
    pads = list(pads) if bench_task(spec.task).peer_pads_samples else [peer.options.pad]
    best = None
    for pad in pads:
        peer.with_options(pad=pad)
        warmed = warm_shapes(peer, spec, requests, batcher, [1])
        entry = {"warmup": warmed}
        if len(pads) > 1:
            entry["mean_ms"] = time_sequential(batcher, requests[:probe_requests])
            progress(f"  probe {pad}: {len(warmed['lengths'])} lengths warmed in {warmed['seconds']:.1f} s, "
                     f"then {entry['mean_ms']:.1f} ms a request")
            if best is None or entry["mean_ms"] < setup["probe"][best]["mean_ms"]:
                best = pad
        setup["probe"][pad] = entry
    best = best or pads[0]
    peer.with_options(pad=best, max_batch=max_batch)
    batcher.max_batch = max_batch
    if max_batch > 1:
        setup["warmup_batched"] = warm_shapes(peer, spec, requests, batcher, range(2, max_batch + 1))
    setup["chosen"] = {"pad": best, "max_batch": max_batch}
    progress(f"  {spec.name}: {peer.description(spec.task)}")
    return setup


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--peer", required=True, metavar="MODEL_DIR", help="HF checkpoint")
    p.add_argument("--mode", required=True, choices=MODES)
    p.add_argument("--workload", required=True, help="W1, W2, W3 or a comma list")
    p.add_argument("--out", required=True, help="JSON file to write")
    p.add_argument("--tokenizer", default=None, help="tokenizer dir that sizes the requests (default: --peer)")
    p.add_argument("--pool", type=int, default=64)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--concurrency", default="1,2,4")
    p.add_argument("--duration", type=float, default=5.0)
    p.add_argument("--warmup", type=float, default=1.0)
    p.add_argument("--max-requests", type=int, default=20000)
    p.add_argument("--open-loop-rate", default=None)
    p.add_argument("--device", default=None)
    p.add_argument("--dtype", default=None)
    p.add_argument("--max-batch", type=int, default=4, help="requests per call at most (default %(default)s)")
    p.add_argument("--pads", default=None, help="score paddings to probe (default: eager bucket,longest; "
                   "compiled bucket)")
    p.add_argument("--bucket", type=int, default=64, help="bucket padding granularity in tokens")
    p.add_argument("--probe-requests", type=int, default=8)
    p.add_argument("--compile-mode", default="reduce-overhead", help="torch.compile mode (compiled peer)")


def run(args, progress=runner.loadgen.stderr_progress) -> int:
    specs = [get_workload(w.strip()) for w in args.workload.split(",") if w.strip()]
    pads = (args.pads or ("bucket" if args.mode == "compiled" else "bucket,longest")).split(",")
    levels = tuple(int(c) for c in args.concurrency.split(","))
    cfg = runner.BenchConfig(concurrencies=levels, duration_s=args.duration, warmup_s=args.warmup,
                             max_requests=args.max_requests, open_loop_rate=args.open_loop_rate, seed=args.seed)
    out = {"mode": args.mode, "peer": args.peer, "workloads": {}}
    tokenizer = load_tokenizer(args.tokenizer or args.peer)
    t0 = time.perf_counter()
    try:
        peer = HFPeer(args.peer, device=args.device, dtype=args.dtype,
                      options=PeerOptions(mode=args.mode, pad=pads[0], bucket=args.bucket,
                                          compile_mode=args.compile_mode))
    except Exception as exc:
        out["error"] = f"{type(exc).__name__}: {exc}"
        report.write_json(args.out, out)
        return 1
    out["load_s"] = time.perf_counter() - t0
    for spec in specs:
        requests = make_requests(spec, tokenizer, args.pool, args.seed)
        system = out["workloads"].setdefault(spec.name, {"target": peer.description(spec.task), "error": None})
        progress(f"{spec.name}: peer {args.mode}: warming every shape of {len(requests)} requests")
        batcher = Batcher(batch_call(peer, spec))
        try:
            t = time.perf_counter()
            setup = prepare(peer, spec, requests, batcher, pads, max_batch_for(args.mode, spec.task, args.max_batch),
                            min(args.probe_requests, len(requests)), progress)
            setup["seconds"] = time.perf_counter() - t
        except Exception as exc:
            system["error"] = f"{type(exc).__name__}: {exc} (while warming up)"
            report.write_json(args.out, out)
            batcher.close()
            continue

        def on_update(partial, name=spec.name, setup=setup, batcher=batcher):
            out["workloads"][name] = {**partial, "setup": setup, "requests_per_call": dict(batcher.sizes)}
            report.write_json(args.out, out)

        on_update({"target": peer.description(spec.task), "sweep": None, "open_loop": None, "error": None})

        shape, _ = runner.model_shape(spec, [args.peer])
        runner.run_system(batcher, requests, cfg, target=peer.description(spec.task),
                          work_of=runner.work_function(spec, shape), progress=progress, on_update=on_update)
        batcher.close()
    return 0


def run_in_subprocess(argv: Sequence[str], out_json: str | Path) -> dict:
    """Run this module as a child process (its progress on our stderr); its JSON, or an error. On
    Ctrl-C or a time limit the child is stopped and what it finished comes back, with
    "interrupted": True (the caller then stops too)."""
    out_json = Path(out_json)
    out_json.unlink(missing_ok=True)
    cmd = [sys.executable, "-m", "boundgen.bench.peer_process", *argv, "--out", str(out_json)]
    interrupted = False
    try:
        code = subprocess.run(cmd).returncode
    except KeyboardInterrupt:  # subprocess.run has killed the child
        code, interrupted = 130, True
    data = json.loads(out_json.read_text()) if out_json.is_file() else {"workloads": {}}
    if interrupted:
        data["interrupted"] = True
        data["error"] = "interrupted (Ctrl-C or a time limit): the levels shown finished"
    elif code != 0 and "error" not in data:
        data["error"] = f"peer process exited with status {code}"
    data["command"] = " ".join(cmd)
    return data


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python3 -m boundgen.bench.peer_process",
                                     description=__doc__.splitlines()[0])
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)  # Batcher and load-generator threads are daemons; a hung one must not block the exit
