"""Kernel-level A/B of a beam decode layer's MLP tail: SwiGLU, the down projection, the residual add
and the next RMSNorm, at W2's shapes (Qwen2.5-0.5B: H 896, I 4,864; rows = R x W beams).

- "inductor + cublas": what a build with the separate ops runs, the torch reference compiled by
  Inductor (its SwiGLU kernel, cuBLAS's down projection, split-K with its reduction at these rows,
  and the add + norm kernel);
- "triton swiglu_down + add_rmsnorm": SwiGLU as the prologue of a split-K GEMM that writes FP32
  partial products (ops/swiglu_down.py), summed by the add + norm kernel (ops/add_rmsnorm.py),
  at the default launch config and at each of SWEEP.

The weights come from HBM, as in the model, where a decode step reads every layer's weights once:
each call takes the next of enough copies of the down weight to overflow L2 (bench/gemms.py).
Timing: bench/kernel_timing.py (GPU time a call from a CUDA graph). Errors: against the eager
torch reference's (h, y).

    python -m boundgen.bench.decode_mlp [--rows 100,200,400,800]
"""

from __future__ import annotations

import argparse
import itertools
import math
import sys

import torch
import torch.nn.functional as F

from boundgen.bench.gemms import cold_copies
from boundgen.bench.kernel_timing import KernelTiming, markdown_table, measure
from boundgen.ops import add_rmsnorm, rmsnorm, silu_mul, swiglu_down

EPS = 1e-6
# (BLOCK_M, BLOCK_N, BLOCK_K, num_warps, num_stages, k_split) timed beside the default.
SWEEP = [(128, 64, 64, 4, 3, 512), (128, 64, 64, 8, 3, 512), (128, 128, 64, 8, 3, 512), (128, 128, 32, 8, 3, 256),
         (128, 128, 64, 8, 3, 256), (64, 128, 64, 4, 3, 320), (64, 64, 64, 4, 3, 512), (128, 256, 32, 8, 3, 128),
         (64, 256, 64, 8, 3, 128), (128, 128, 64, 4, 3, 320), (64, 128, 32, 4, 3, 256), (64, 64, 32, 4, 3, 256),
         (128, 64, 32, 4, 3, 256), (128, 128, 64, 8, 4, 640)]


def reference_tail(x, w, h, norm_weight):
    """(h + down(silu_mul(x)), its RMSNorm): the separate ops, as a build without the fusion computes them."""
    return add_rmsnorm.reference(h, F.linear(silu_mul.reference(x), w), norm_weight, EPS)


def triton_tail(x, w, h, norm_weight, k_split=swiglu_down.K_SPLIT, config=None):
    return rmsnorm.launch(h, norm_weight, EPS, delta=swiglu_down.launch(x, w, k_split, config))


def bench_decode_mlp(rows: int, hidden: int = 896, inter: int = 4864, sweep=SWEEP, device: str = "cuda",
                     calls: int = 20, replays: int = 10, dtype: torch.dtype = torch.bfloat16,
                     cold: bool = True) -> list[KernelTiming]:
    gen = torch.Generator(device=device).manual_seed(rows)
    x = torch.randn(rows, 2 * inter, device=device, generator=gen).to(dtype)
    w = (torch.randn(hidden, inter, device=device, generator=gen) / math.sqrt(inter)).to(dtype)
    h = (3 * torch.randn(rows, hidden, device=device, generator=gen)).to(dtype)
    norm_weight = (1 + 0.1 * torch.randn(hidden, device=device, generator=gen)).to(dtype)
    copies = [w.clone() for _ in range(cold_copies(w.numel() * w.element_size()))] if cold else [w]
    turn = itertools.count()

    def weight():
        return copies[next(turn) % len(copies)]
    compiled = torch.compile(reference_tail, dynamic=False)
    impls = {"inductor + cublas": lambda: compiled(x, weight(), h, norm_weight),
             "triton swiglu_down + add_rmsnorm": lambda: triton_tail(x, weight(), h, norm_weight)}
    for *config, k_split in sweep:
        impls[f"triton, config {tuple(config)} k_split {k_split}"] = (
            lambda c=tuple(config), k=k_split: triton_tail(x, weight(), h, norm_weight, k, c))
    flops = 2.0 * rows * hidden * inter
    nbytes = float((hidden * inter + 2 * rows * inter + 3 * rows * hidden) * dtype.itemsize)
    case = f"decode MLP tail rows={rows} H={hidden} I={inter}" + (", weights from HBM" if cold else "")
    return measure(case, impls, (flops, nbytes), max(calls, len(copies)), replays,
                   reference=lambda: reference_tail(x, w, h, norm_weight))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m boundgen.bench.decode_mlp", description=__doc__.split("\n")[0])
    parser.add_argument("--rows", default="100,200,400,800", help="comma-separated row counts (R x W beams)")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("error: the decode MLP benchmark needs a CUDA device", file=sys.stderr)
        return 2
    try:
        rows = [int(r) for r in args.rows.split(",")]
        if min(rows) < 1:
            raise ValueError
    except ValueError:
        print(f"error: --rows must be comma-separated positive integers; got {args.rows!r}", file=sys.stderr)
        return 2
    print(markdown_table([t for r in rows for t in bench_decode_mlp(r)]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
