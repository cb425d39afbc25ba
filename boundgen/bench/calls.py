"""What a program call costs against the requests it holds: does batching pay?

For R = 1, 2, 4, ... up to what one call's bounds allow, R copies of one request run as one
call of the engine's program (`LocalEngine.program_call`, staged once, the device synchronised
after each call; CUDA graphs replayed when the engine captured them), timed over `iterations`
calls after `warmup`. Per-call time that grows sub-linearly in R is what makes batching pay.
GPU time only: no tokenizing, no RPC, no queueing.

On CUDA each R is also profiled over `profiled` more calls (torch.profiler, kernels inside CUDA
graph replays included): kernels a call and GPU ms a call (the union of the kernels' and copies'
intervals, bench/profile.py), so that what a call launches is published beside what it costs;
wall ms above GPU ms is the time the GPU waits within a call.
"""

from __future__ import annotations

import json
import statistics
import tempfile
import time
from pathlib import Path
from typing import Sequence

from boundgen.bench.profile import analyze_trace


TOP_KERNELS = 20  # kernels a row names, by GPU time


def call_curve(engine, texts: Sequence[str], requests: Sequence[int] = (1, 2, 4, 8, 16), iterations: int = 20,
               warmup: int = 3, profiled: int = 3) -> list[dict]:
    """[{requests, call_ms (median), request_ms, speedup (vs R x the one-request call), and on CUDA
    kernels_per_call, gpu_ms_per_call}] for each R that fits one call; R past the bounds are left
    out. `profiled`: calls profiled a row (0: none)."""
    rows = []
    for r in requests:
        try:
            call = engine.program_call(list(texts), copies=r)
        except ValueError:
            break
        for _ in range(warmup):
            call()
        times = []
        for _ in range(iterations):
            start = time.perf_counter()
            call()
            times.append((time.perf_counter() - start) * 1e3)
        ms = statistics.median(times)
        rows.append({"requests": r, "call_ms": ms, "request_ms": ms / r, **profile_calls(call, profiled)})
    for row in rows:
        row["speedup"] = rows[0]["call_ms"] * row["requests"] / row["call_ms"]
    return rows


def profile_calls(call, calls: int) -> dict:
    """{kernels_per_call, gpu_ms_per_call} over `calls` profiled calls on CUDA; {} elsewhere."""
    import torch

    if calls <= 0 or not torch.cuda.is_available():
        return {}
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            call()
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "trace.json"
        prof.export_chrome_trace(str(path))
        trace = json.loads(path.read_text())
    return per_call(analyze_trace(trace, top=TOP_KERNELS), calls)


def per_call(summary: dict, calls: int) -> dict:
    """A profile summary (bench/profile.py analyze_trace) of `calls` calls -> the per-call figures:
    kernels and GPU ms a call, and the kernels that take the most GPU time (launches and us a call)."""
    top = [{"name": k["name"], "launches_per_call": k["count"] / calls, "us_per_call": k["total_ms"] * 1e3 / calls,
            "mean_us": k["mean_us"]} for k in summary.get("top_kernels", [])]
    return {"kernels_per_call": summary["kernels"] / calls, "gpu_ms_per_call": summary["gpu_busy_ms"] / calls,
            "top_kernels": top}


def markdown(rows: list[dict], title: str) -> str:
    kernels = all("kernels_per_call" in r for r in rows)
    head = "| requests per call | ms per call | ms per request | vs one call each |"
    lines = [f"{title}", "", head + (" kernels a call | GPU ms a call |" if kernels else ""),
             "|---|---|---|---|" + ("---|---|" if kernels else "")]
    for r in rows:
        line = f"| {r['requests']} | {r['call_ms']:.2f} | {r['request_ms']:.2f} | {r['speedup']:.2f}x |"
        if kernels:
            line += f" {r['kernels_per_call']:.0f} | {r['gpu_ms_per_call']:.2f} |"
        lines.append(line)
    for r in rows:  # where a call's GPU time goes, for the fewest and the most requests a call
        if r.get("top_kernels") and r in (rows[0], rows[-1]):
            lines += ["", f"Kernels of a call of {r['requests']} requests, by GPU time:", "",
                      "| kernel | launches a call | us a call | us a launch |", "|---|---:|---:|---:|"]
            lines += [f"| `{k['name'][:90]}` | {k['launches_per_call']:.0f} | {k['us_per_call']:.1f} | "
                      f"{k['mean_us']:.1f} |" for k in r["top_kernels"]]
    return "\n".join(lines)


def main(argv=None) -> int:
    """`python -m boundgen.bench.calls ARTIFACT --workload W2 [--requests 1,2,4,8]`: the curve for
    one request of the workload (seeded), printed as markdown; --json writes the rows too."""
    import argparse

    import boundgen
    from boundgen.bench.workloads import get_workload, load_tokenizer, make_requests

    parser = argparse.ArgumentParser(prog="python -m boundgen.bench.calls", description=main.__doc__)
    parser.add_argument("artifact")
    parser.add_argument("--workload", required=True, help="W1, W2 or W3")
    parser.add_argument("--requests", default="1,2,4,8,16", help="requests per call, comma list")
    parser.add_argument("--iterations", type=int, default=20)
    parser.add_argument("--json", default=None, help="also write the rows to this file")
    args = parser.parse_args(argv)
    spec = get_workload(args.workload)
    request = make_requests(spec, load_tokenizer(args.artifact), 1, seed=0)[0]
    engine = boundgen.load(args.artifact)
    try:
        engine.warmup()  # CUDA graphs captured for every padded shape, as when serving
        rows = call_curve(engine, request.texts, [int(r) for r in args.requests.split(",")], args.iterations)
    finally:
        engine.close()
    print(markdown(rows, f"{args.workload} ({request.tokens} tokens a request), {args.artifact}"))
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
