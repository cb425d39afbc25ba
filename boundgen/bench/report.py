"""Bench results on disk: JSON, the latency-vs-QPS plot, markdown tables for docs/benchmarks.md.

A result is one workload's dict as `boundgen bench` writes it:
    {"workload": {...}, "date", "env", "host": {...} (bench/host.py), "command",
     "systems": {"boundgen": {"target", "sweep": {"levels", "stop_reason", "capacity"},
                              "open_loop", "error"}, "peer_eager": {...}, "peer_compiled": {...}},
     "diagnostic": {...} | None, "profiles": {system: markdown file name}}

Combine several runs from the shell:
    python3 -m boundgen.bench.report OUT/bench_*.json --png OUT/latency_vs_qps.png --markdown OUT/summary.md
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path
from typing import Sequence

from boundgen.bench.loadgen import LatencyBudget
from boundgen.bench.tasks import BENCH_TASKS

STYLES = {"boundgen": dict(color="tab:blue", marker="o"), "peer": dict(color="tab:orange", marker="s"),
          "peer_eager": dict(color="tab:orange", marker="s"), "peer_compiled": dict(color="tab:red", marker="D")}


def write_json(path: str | Path, result: dict) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(result, indent=2, sort_keys=False, default=_jsonable) + "\n")
    tmp.replace(path)
    return path


def read_json(path: str | Path) -> dict:
    return json.loads(Path(path).read_text())


def _jsonable(obj):
    if hasattr(obj, "tolist"):
        return obj.tolist()
    if hasattr(obj, "to_dict"):
        return obj.to_dict()
    return str(obj)


def _levels(system: dict) -> list[dict]:
    return [lv for lv in (system.get("sweep") or {}).get("levels", []) if lv.get("completed")]


def plot_latency(results: Sequence[dict], path: str | Path, budget: LatencyBudget = LatencyBudget()) -> Path:
    """One chart per workload: mean (solid) and P99 (dashed) latency against QPS for every system,
    with the budget lines; points are labelled with their concurrency."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    n = max(1, len(results))
    fig, axes = plt.subplots(1, n, figsize=(5.5 * n, 4.2), squeeze=False)
    for ax, result in zip(axes[0], results):
        for name, system in result.get("systems", {}).items():
            levels = _levels(system)
            if not levels:
                continue
            style = STYLES.get(name, dict(marker="^"))
            qps = [lv["qps"] for lv in levels]
            ax.plot(qps, [lv["mean_ms"] for lv in levels], linestyle="-", label=f"{name} mean", **style)
            ax.plot(qps, [lv["p99_ms"] for lv in levels], linestyle="--", alpha=0.7, label=f"{name} P99", **style)
            for lv in levels:
                ax.annotate(f"c{lv['concurrency']}", (lv["qps"], lv["mean_ms"]), textcoords="offset points",
                            xytext=(3, 3), fontsize=7, color=style.get("color"))
        ax.axhline(budget.mean_ms, color="green", linewidth=0.8, linestyle=":", label=f"mean < {budget.mean_ms:g} ms")
        ax.axhline(budget.p99_ms, color="red", linewidth=0.8, linestyle=":", label=f"P99 < {budget.p99_ms:g} ms")
        wl = result.get("workload", {})
        ax.set_title(f"{wl.get('name', '?')} ({wl.get('task', '?')})")
        ax.set_xlabel("throughput (requests/s)")
        ax.set_ylabel("latency (ms)")
        ax.set_yscale("log")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def _f(value, fmt="{:.1f}", missing="-"):
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return missing
    return fmt.format(value)


LEVEL_HEADER = ("| system | load | QPS | samples/s | mean ms | P50 ms | P99 ms | pre | model | post | queue "
                "| link | rpc | per call | eff. MFU | errors |\n"
                "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")


def level_row(system: str, lv: dict) -> str:
    load = f"c={lv['concurrency']}" if lv.get("mode") == "closed" else f"open {lv.get('rate', 0):.0f}/s"
    b = lv.get("breakdown_ms") or {}
    errors = sum((lv.get("errors") or {}).values()) + lv.get("unfinished", 0)
    mfu = lv.get("effective_mfu")
    return (f"| {system} | {load} | {_f(lv['qps'])} | {_f(lv['samples_per_s'], '{:.0f}')} | {_f(lv.get('mean_ms'))} "
            f"| {_f(lv.get('p50_ms'))} | {_f(lv.get('p99_ms'))} | {_f(b.get('pre'), '{:.2f}')} "
            f"| {_f(b.get('model'), '{:.2f}')} | {_f(b.get('post'), '{:.2f}')} | {_f(b.get('queue'), '{:.2f}')} "
            f"| {_f(b.get('link'), '{:.2f}')} | {_f(b.get('rpc'), '{:.2f}')} | {_f(b.get('requests_per_call'), '{:.2f}')} "
            f"| {_f(None if mfu is None else 100 * mfu, '{:.1f}%')} | {errors or ''} |")


def _capacity_and_peak(system: dict) -> tuple[float, float]:
    cap = (system.get("sweep") or {}).get("capacity")
    return (cap["qps"] if cap else 0.0), max((lv["qps"] for lv in _levels(system)), default=0.0)


def best_peer(result: dict) -> str | None:
    """The peer system (name starting with "peer") with the most QPS within the budget, then at peak."""
    peers = {n: s for n, s in result.get("systems", {}).items() if n.startswith("peer") and _levels(s)}
    return max(peers, key=lambda n: _capacity_and_peak(peers[n]), default=None)


def comparison(result: dict) -> str | None:
    """boundgen against the best peer of the same run, in one sentence; None without both."""
    systems, peer = result.get("systems", {}), best_peer(result)
    if peer is None or not _levels(systems.get("boundgen") or {}):
        return None
    (b_cap, b_peak), (p_cap, p_peak) = _capacity_and_peak(systems["boundgen"]), _capacity_and_peak(systems[peer])
    within = (f"{b_cap:.1f} vs {p_cap:.1f} QPS ({b_cap / p_cap:.1f}x)" if p_cap and b_cap else
              f"{b_cap:.1f} QPS vs none for the peer" if b_cap else
              f"none vs {p_cap:.1f} QPS" if p_cap else "neither has a level")
    return (f"boundgen against the best peer of this run ({peer}): within the budget {within}; at peak "
            f"{b_peak:.1f} vs {p_peak:.1f} QPS ({b_peak / p_peak:.1f}x).")


def host_line(host: dict | None) -> str | None:
    """The host of a result in one sentence (bench/host.py's record); None for results without one."""
    if not host:
        return None
    procs = host.get("client_procs", 1)
    clients = f"{procs} client processes" if procs != 1 else "1 client process"
    server = f"; server cores {host['server_cores']}" if host.get("server_cores") else ""
    return (f"Host: {host.get('cpu_model', '?')}, {host.get('logical_cores', '?')} logical cores; bench on "
            f"{host.get('bench_core_count', '?')} cores ({host.get('bench_cores', '?')}), {clients}{server}.")


def markdown_workload(result: dict) -> str:
    """A section for one workload: setup, host, capacity points, every level, client check,
    diagnostic, profiles."""
    wl = result.get("workload", {})
    out = [f"### {wl.get('name')}: {wl.get('task')}", ""]
    shape = BENCH_TASKS.get(wl.get("task"), BENCH_TASKS["beam"]).describe(wl)  # results of no task: as before
    out.append(f"{shape}; pool of {wl.get('pool')} requests, seed {wl.get('seed')}; "
               f"{_f(wl.get('gflops_per_request'), '{:.1f}')} logical GFLOP per request.")
    host = host_line(result.get("host"))
    if host:
        out.append(host)
    out.append("")
    out.append("| system | target | capacity point (mean < 20 ms, P99 < 80 ms) | peak QPS | eff. MFU at capacity | sweep stop |")
    out.append("|---|---|---|---|---|---|")
    for name, system in result.get("systems", {}).items():
        sweep = system.get("sweep") or {}
        if system.get("error") and not sweep.get("levels"):
            out.append(f"| {name} | {system.get('target', '')} | failed: {system['error']} | | | |")
            continue
        cap = sweep.get("capacity")
        levels = _levels(system)
        peak = max((lv["qps"] for lv in levels), default=None)
        cap_text = (f"{cap['qps']:.1f} QPS at c={cap['concurrency']} (mean {cap['mean_ms']:.1f}, "
                    f"P99 {cap['p99_ms']:.1f} ms)" if cap else "none")
        mfu = cap.get("effective_mfu") if cap else None
        out.append(f"| {name} | {system.get('target', '')} | {cap_text} | {_f(peak)} "
                   f"| {_f(None if mfu is None else 100 * mfu, '{:.1f}%')} | {system.get('error') or sweep.get('stop_reason', '')} |")
    line = comparison(result)
    if line:
        out += ["", line]
    out += ["", LEVEL_HEADER]
    for name, system in result.get("systems", {}).items():
        for lv in _levels(system):
            out.append(level_row(name, lv))
        if system.get("open_loop"):
            out.append(level_row(name, system["open_loop"]))
    out.append("")
    out.append("Breakdown columns are mean ms per request from the engine's timings; queue = end-to-end "
               "minus pre + model + post (served: the engine's queue); link = a front-end process to the engine "
               "process and back; rpc = the client's end-to-end minus the server's handling; per call = requests "
               "in the model call a request rode in, on average.")
    for name, system in result.get("systems", {}).items():
        check = client_check_line(system.get("client_check"))
        if check:
            out += ["", f"{name}: {check}"]
    diag = result.get("diagnostic")
    if diag:
        out += ["", f"Diagnostic ({diag.get('tokens')} tokens, {diag.get('samples')} samples, sequential): "
                    f"full engine {_f(diag.get('engine_ms'), '{:.3f}')} ms vs its program alone "
                    f"{_f(diag.get('node_ms'), '{:.3f}')} ms per request: the engine costs "
                    f"{_f(diag.get('overhead_pct'), '{:+.1f}')}% ({diag.get('note', '')})."]
    for name, file in (result.get("profiles") or {}).items():
        out.append(f"\nProfile of {name}: `{file}`.")
    return "\n".join(out) + "\n"


def client_check_line(check: dict | None) -> str | None:
    """bench/clients.py's check of the load generator, in one sentence; None when it did not run."""
    if not check:
        return None
    if check.get("skipped"):
        return f"client check skipped: {check['skipped']}."
    verdict = ("the load generator is not the bottleneck" if check.get("ok") else
               "WARNING: the load generator may be the bottleneck")
    return (f"client check at c={check.get('concurrency')}: {check['procs']} client processes "
            f"{check['qps']:.1f} QPS, {check['procs_2x']} processes {check['qps_2x']:.1f} QPS "
            f"({check['change']:+.1f}%): {verdict}.")


def markdown_summary(results: Sequence[dict]) -> str:
    if not results:
        return "No benchmark results.\n"
    env = results[0].get("env", {})
    head = ["## Results", "", f"Date {results[0].get('date', '?')}; " +
            ", ".join(f"{k} {v}" for k, v in env.items()), ""]
    for command in dict.fromkeys(r.get("command") for r in results if r.get("command")):
        head.append(f"- `{command}`")
    return "\n".join(head) + "\n\n" + "\n".join(markdown_workload(r) for r in results)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python3 -m boundgen.bench.report",
                                     description="Combine bench JSON files into one plot and one markdown summary.")
    parser.add_argument("json", nargs="+", help="bench_*.json files written by `boundgen bench`")
    parser.add_argument("--png", help="write the latency-vs-QPS plot here")
    parser.add_argument("--markdown", help="write the markdown summary here (also printed)")
    args = parser.parse_args(argv)
    results = [read_json(p) for p in args.json]
    if args.png:
        plot_latency(results, args.png)
    text = markdown_summary(results)
    if args.markdown:
        Path(args.markdown).write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
