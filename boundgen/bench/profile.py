"""Where the time goes: torch.profiler around N requests at one concurrency.

Reports, from the profiler's Chrome trace (Kineto events):
- GPU kernels (cat "kernel"; memcpy / memset counted apart): top kernels by total time;
- GPU busy: the union of all kernel intervals over the window from the first kernel's start to
  the last one's end; the rest is idle time;
- gaps between kernel launches on each stream: the time a stream sits idle between one kernel's
  end and its next kernel's start (launch-bound code shows many small gaps);
- CPU: process CPU seconds over wall seconds, and the top CPU ops by self time.
Without CUDA it still profiles the CPU side (no kernel rows).
"""

from __future__ import annotations

import gzip
import json
import time
from collections import defaultdict
from pathlib import Path
from typing import Callable, Sequence

import numpy as np

from boundgen.bench.loadgen import closed_loop

GPU_CATS = ("kernel", "gpu_memcpy", "gpu_memset")


def profile_requests(call: Callable, requests: Sequence, *, concurrency: int = 1, n_requests: int = 50,
                     trace_path: str | Path | None = None, top: int = 15) -> dict:
    """Profile `n_requests` closed-loop requests at `concurrency`; returns the summary dict."""
    import torch
    from torch.profiler import ProfilerActivity, profile, record_function

    def labelled(request):  # one "bench.request" span per request in the trace
        with record_function("bench.request"):
            return call(request)

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if torch.cuda.is_available() else [])
    with profile(activities=activities, experimental_config=_all_threads()) as prof:
        cpu0, wall0 = time.process_time(), time.perf_counter()
        stats = closed_loop(labelled, requests, concurrency, duration_s=600.0, warmup_s=0.0,
                            max_requests=n_requests, progress=None)
        cpu_s, wall_s = time.process_time() - cpu0, time.perf_counter() - wall0
    trace_path = Path(trace_path) if trace_path else Path("/tmp") / f"boundgen_trace_{time.time_ns()}.json"
    raw = trace_path.with_suffix("") if trace_path.suffix == ".gz" else trace_path
    prof.export_chrome_trace(str(raw))
    trace = json.loads(raw.read_text())
    if trace_path.suffix == ".gz":
        with gzip.open(trace_path, "wt") as f:
            json.dump(trace, f)
        raw.unlink()
    summary = analyze_trace(trace, top=top)
    summary.update(
        concurrency=concurrency, requests=stats.completed, errors=stats.errors, wall_s=wall_s, cpu_s=cpu_s,
        cpu_cores_busy=cpu_s / wall_s if wall_s else None, qps=stats.qps, mean_ms=stats.mean_ms,
        trace=str(trace_path), top_cpu_ops=_top_cpu_ops(prof, top))
    return summary


def _all_threads():
    """Record CPU ops of the load generator's worker threads too (by default only the profiling
    thread's ops are recorded; GPU kernels are recorded either way)."""
    try:
        from torch._C._profiler import _ExperimentalConfig

        return _ExperimentalConfig(profile_all_threads=True)
    except (ImportError, TypeError):  # older torch: CPU ops of the calling thread only
        return None


def _top_cpu_ops(prof, top: int) -> list[dict]:
    rows = sorted(prof.key_averages(), key=lambda e: e.self_cpu_time_total, reverse=True)[:top]
    return [{"name": e.key, "calls": e.count, "self_cpu_ms": e.self_cpu_time_total / 1e3,
             "cpu_total_ms": e.cpu_time_total / 1e3} for e in rows]


def _union_length(intervals: list[tuple[float, float]]) -> float:
    total, cur_start, cur_end = 0.0, None, None
    for start, end in sorted(intervals):
        if cur_end is None or start > cur_end:
            if cur_end is not None:
                total += cur_end - cur_start
            cur_start, cur_end = start, end
        else:
            cur_end = max(cur_end, end)
    if cur_end is not None:
        total += cur_end - cur_start
    return total


def analyze_trace(trace: dict, top: int = 15) -> dict:
    """Kernel totals, GPU busy fraction and per-stream launch gaps from a Chrome trace (times in us)."""
    events = trace.get("traceEvents", trace) if isinstance(trace, dict) else trace
    gpu = [e for e in events if e.get("ph") == "X" and e.get("cat") in GPU_CATS]
    kernels = [e for e in gpu if e["cat"] == "kernel"]
    out = {"kernels": len(kernels), "top_kernels": [], "streams": {}, "gpu_window_ms": 0.0, "gpu_busy_ms": 0.0,
           "gpu_busy_fraction": None, "memcpy_ms": sum(e["dur"] for e in gpu if e["cat"] != "kernel") / 1e3}
    if not gpu:
        return out
    spans = [(float(e["ts"]), float(e["ts"]) + float(e["dur"])) for e in gpu]
    window = max(s[1] for s in spans) - min(s[0] for s in spans)
    busy = _union_length(spans)
    out.update(gpu_window_ms=window / 1e3, gpu_busy_ms=busy / 1e3, gpu_busy_fraction=busy / window if window else None)
    by_name = defaultdict(lambda: [0, 0.0])
    for e in kernels:
        by_name[e["name"]][0] += 1
        by_name[e["name"]][1] += float(e["dur"])
    kernel_total = sum(v[1] for v in by_name.values()) or 1.0
    for name, (count, total) in sorted(by_name.items(), key=lambda kv: kv[1][1], reverse=True)[:top]:
        out["top_kernels"].append({"name": name, "count": count, "total_ms": total / 1e3, "mean_us": total / count,
                                   "share": total / kernel_total})
    by_stream = defaultdict(list)
    for e in gpu:
        by_stream[(e.get("args") or {}).get("stream", e.get("tid"))].append((float(e["ts"]), float(e["dur"])))
    for stream, items in by_stream.items():
        items.sort()
        gaps = np.array([max(0.0, nxt[0] - (cur[0] + cur[1])) for cur, nxt in zip(items, items[1:])] or [0.0])
        out["streams"][str(stream)] = {
            "ops": len(items), "busy_ms": sum(d for _, d in items) / 1e3, "gap_total_ms": float(gaps.sum()) / 1e3,
            "gap_median_us": float(np.median(gaps)), "gap_p99_us": float(np.percentile(gaps, 99)),
            "gaps_over_10us": int((gaps > 10).sum()), "gap_max_us": float(gaps.max())}
    return out


def profile_markdown(title: str, summary: dict) -> str:
    s = summary
    lines = [f"## Profile: {title}", ""]
    lines.append(f"{s.get('requests')} requests at concurrency {s.get('concurrency')}, {s.get('wall_s', 0):.2f} s wall "
                 f"({s.get('qps') or 0:.1f} QPS under the profiler, mean {s.get('mean_ms') or 0:.1f} ms); "
                 f"CPU {s.get('cpu_s', 0):.2f} s = {s.get('cpu_cores_busy') or 0:.2f} cores busy.")
    if s.get("gpu_busy_fraction") is not None:
        lines.append(f"GPU: {s['kernels']} kernels; busy {s['gpu_busy_ms']:.1f} of {s['gpu_window_ms']:.1f} ms "
                     f"({100 * s['gpu_busy_fraction']:.1f}%); memcpy/memset {s['memcpy_ms']:.2f} ms.")
    else:
        lines.append("GPU: no device activity recorded.")
    if s.get("top_kernels"):
        lines += ["", "| kernel | calls | total ms | mean us | share |", "|---|---|---|---|---|"]
        for k in s["top_kernels"]:
            name = k["name"] if len(k["name"]) <= 90 else k["name"][:87] + "..."
            lines.append(f"| `{name}` | {k['count']} | {k['total_ms']:.2f} | {k['mean_us']:.1f} | {100 * k['share']:.1f}% |")
    if s.get("streams"):
        lines += ["", "| stream | ops | busy ms | gaps ms | median gap us | P99 gap us | gaps > 10 us | max gap us |",
                  "|---|---|---|---|---|---|---|---|"]
        for name, st in s["streams"].items():
            lines.append(f"| {name} | {st['ops']} | {st['busy_ms']:.2f} | {st['gap_total_ms']:.2f} | "
                         f"{st['gap_median_us']:.1f} | {st['gap_p99_us']:.1f} | {st['gaps_over_10us']} | {st['gap_max_us']:.0f} |")
    if s.get("top_cpu_ops"):
        lines += ["", "| CPU op | calls | self CPU ms | CPU total ms |", "|---|---|---|---|"]
        for op in s["top_cpu_ops"]:
            lines.append(f"| `{op['name'][:80]}` | {op['calls']} | {op['self_cpu_ms']:.2f} | {op['cpu_total_ms']:.2f} |")
    if s.get("trace"):
        lines += ["", f"Trace: `{Path(s['trace']).name}` (chrome://tracing, Perfetto)."]
    return "\n".join(lines) + "\n"
