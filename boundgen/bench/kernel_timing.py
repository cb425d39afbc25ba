"""What the kernel benchmarks share (bench/kernels.py, bench/selection.py, bench/decode_mlp.py): a
timing row, the GPU time of a call, timing implementations against a reference, the markdown table.

Timing: GPU time per call, a CUDA graph of `calls` back-to-back calls replayed `replays` times
(median), so host launch overhead is out and L2 is warm (unless the caller rotates its inputs).

Roofline (`roofline_table`): a row's bytes moved (reads + writes, counted from its shapes and
dtypes by the benchmark) over its time, against an HBM peak (the H200's 4.8e12 B/s by default; ~4.0e12
is reachable), and for GEMM-like kernels (attention, projections) its FLOPs against the tensor
peak it runs at (`tensor_peak`: BF16 989e12, FP8 1979e12 dense).
"""

from __future__ import annotations

import statistics
import sys
from dataclasses import dataclass
from typing import Callable

import torch

PEAK_BF16_FLOPS = 989e12  # H200 dense BF16
PEAK_FP8_FLOPS = 1979e12  # H200 dense FP8
HBM_PEAK_BYTES_PER_S = 4.8e12  # H200 HBM3e
COPY_BYTES_PER_S = 4.1e12  # measured device copy (GPU.md)


@dataclass(frozen=True)
class KernelTiming:
    case: str
    impl: str
    time_us: float
    flops: float
    bytes: float
    max_abs_err: float  # against the torch reference's output
    tensor_peak: float = 0.0  # FLOP/s of the tensor cores a GEMM-like kernel runs at; 0: not GEMM-like

    @property
    def tflops(self) -> float:
        return self.flops / self.time_us / 1e6

    @property
    def gbps(self) -> float:
        return self.bytes / self.time_us / 1e3


def gpu_time_us(fn: Callable[[], object], calls: int = 20, replays: int = 10) -> float:
    """Median GPU time of one call of `fn`, from a CUDA graph of `calls` calls."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(3):  # warm up: compile, autotune caches, allocator
            fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(calls):
            fn()
    graph.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(replays):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3 / calls)
    return statistics.median(times)


def measure(case: str, impls: dict[str, Callable[[], object]], work: tuple[float, float], calls: int, replays: int,
            compared: Callable | None = None, reference: Callable | None = None,
            tensor_peak: float = 0.0) -> list[KernelTiming]:
    """Each implementation's GPU time and its largest error against the reference over all its
    outputs (a tensor or a tuple of them): `reference()`, untimed, or else the "torch reference"
    entry of `impls`; `compared(output)`, untimed, where outputs are not compared as they come,
    e.g. E4M3 values and their scales. `work`: (FLOPs, bytes) of a call; `tensor_peak`: see
    KernelTiming."""
    def outputs(fn):
        out = fn() if compared is None else compared(fn())
        return [t.float() for t in (out if isinstance(out, tuple) else (out,))]
    expected = outputs(reference or impls["torch reference"])
    rows = []
    for impl, fn in impls.items():
        try:
            err = max((got - want).abs().max().item() for got, want in zip(outputs(fn), expected))
            rows.append(KernelTiming(case, impl, gpu_time_us(fn, calls, replays), *work, err, tensor_peak))
        except Exception as exc:  # a launch config that does not fit (shared memory) must not hide the rest
            print(f"{case}: {impl} failed: {type(exc).__name__}: {str(exc)[:200]}", file=sys.stderr)
    return rows


def markdown_table(rows: list[KernelTiming]) -> str:
    lines = ["| case | implementation | time (us) | TFLOP/s | % BF16 peak | GB/s | % copy BW "
             "| max abs err vs ref |",
             "|---|---|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        lines.append(f"| {r.case} | {r.impl} | {r.time_us:.1f} | {r.tflops:.1f} | "
                     f"{100 * r.tflops * 1e12 / PEAK_BF16_FLOPS:.1f} | {r.gbps:.0f} | "
                     f"{100 * r.gbps * 1e9 / COPY_BYTES_PER_S:.1f} | {r.max_abs_err:.2e} |")
    return "\n".join(lines)


def roofline_table(rows: list[KernelTiming], hbm_peak: float = HBM_PEAK_BYTES_PER_S) -> str:
    """Markdown: each row's time, bytes moved, achieved bandwidth and its share of `hbm_peak`
    (B/s), and for GEMM-like rows (tensor_peak > 0) FLOPs and their share of that peak."""
    lines = [f"| case | implementation | time (us) | MB moved | GB/s | % HBM peak ({hbm_peak / 1e12:.1f} TB/s) "
             "| GFLOP | % tensor peak | max abs err vs ref |",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        gemm = (f"{r.flops / 1e9:.2f} | {100 * r.tflops * 1e12 / r.tensor_peak:.1f}" if r.tensor_peak > 0
                else " | ")
        lines.append(f"| {r.case} | {r.impl} | {r.time_us:.1f} | {r.bytes / 1e6:.2f} | {r.gbps:.0f} | "
                     f"{100 * r.gbps * 1e9 / hbm_peak:.1f} | {gemm} | {r.max_abs_err:.2e} |")
    return "\n".join(lines)
