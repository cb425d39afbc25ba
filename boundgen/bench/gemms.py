"""GEMM-level A/B of a model's linear layers on CUDA: what the artifact runs against what could replace it.

The projections of one layer (qkv with Qwen2's bias, o, gate_up, down) and the LM head, at the
rows M a call feeds them, bf16 weights as the model holds them ([N, K], F.linear):

- "cublas": F.linear, what an artifact calls today (Inductor's default for these GEMMs).
- "cublas, weights from HBM": the same, each call on another copy of the weight, enough copies
  (WEIGHT_BYTES_COLD in all) that none is still in L2 when it comes round again: a decode step
  reads a layer's weights once, cold (the model is ~1 GB, L2 50 MB), where the case above, one
  weight called back to back, measures them warm in L2.
- "triton autotuned": the same GEMM compiled by Inductor with max-autotune and Triton templates
  only, tuned for this exact shape (what a build with max-autotune would pick among).
- "fp8 rowwise": torch._scaled_mm on e4m3 operands, one scale per activation row and per weight
  row (the weight quantized once, outside the timed call; the activation's amax, scale and cast
  inside it, as a model would run them). Error as SQNR in dB against the bf16 product (torchao
  judges FP8 by an SQNR floor), besides the max abs error.
- "fp8 rowwise, activation quantized": the same GEMM with the activation quantized outside the
  timed call too: the GEMM alone, what a model whose producing kernel writes e4m3 rows and their
  scales (a norm or SwiGLU with the quantization fused) would run.

Cases: W2/W3 beam decode, Qwen2.5-0.5B (H 896, 14/2 heads of D 64, I 4864), M = R x W rows for
R = 1 and 4 requests of W = 100; W1 scoring, Qwen3-0.6B (H 1024, 16/8 heads of D 128, I 3072),
M = 2,250 / 4,500 / 9,000 tokens (calls of 1 / 2 / 4 requests of 15 samples). Autotuning takes
seconds a shape, hence few M. Bytes: weights + activations in + out once; FLOPs 2 M N K. Timing
as bench/kernels.py (CUDA graph of back-to-back calls, median of replays): GPU time only, launch
overhead out.

    python -m boundgen.bench.gemms [--json OUT] [--workloads W2,W1] [--no-autotune]
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import sys
from dataclasses import asdict

import torch
import torch.nn.functional as F

from boundgen.bench.kernel_timing import KernelTiming, gpu_time_us, markdown_table
from boundgen.ops.e4m3 import quantize_rows  # the rowwise E4M3 quantization the FP8 builds use

# (name, N, K, bias) per model: one decoder layer's projections, then the LM head.
QWEN25_05B = [("qkv", 1152, 896, True), ("o", 896, 896, False), ("gate_up", 9728, 896, False),
              ("down", 896, 4864, False), ("lm_head", 151936, 896, False)]
QWEN3_06B = [("qkv", 4096, 1024, False), ("o", 1024, 2048, False), ("gate_up", 6144, 1024, False),
             ("down", 1024, 3072, False)]
WORKLOADS = {"W2": (QWEN25_05B, (100, 400)), "W1": (QWEN3_06B, (2250, 4500, 9000))}
WEIGHT_BYTES_COLD = 128 << 20  # > 2.5 x the H200's L2


def cold_copies(weight_bytes: int) -> int:
    """Copies of a weight whose round trip reads WEIGHT_BYTES_COLD at least (2 at least)."""
    return max(2, -(-WEIGHT_BYTES_COLD // weight_bytes))


def gemm_shapes(workloads: list[str]) -> list[tuple[str, int, int, int, bool]]:
    """(workload, M, N, K, bias) for every case of `workloads` (keys of WORKLOADS)."""
    unknown = [w for w in workloads if w not in WORKLOADS]
    if unknown:
        raise ValueError(f"unknown workloads {unknown}; known: {', '.join(WORKLOADS)}")
    return [(f"{w} {name} M={m}", m, n, k, bias) for w in workloads for name, n, k, bias in WORKLOADS[w][0]
            for m in WORKLOADS[w][1]]


def fp8_linear(x: torch.Tensor, w_q: torch.Tensor, w_scale: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """F.linear(x, w) with both operands in e4m3, rowwise scales, bf16 out (w_q [N, K], w_scale [N, 1])."""
    return scaled_mm(*quantize_rows(x), w_q, w_scale, bias)


def scaled_mm(x_q: torch.Tensor, x_scale: torch.Tensor, w_q: torch.Tensor, w_scale: torch.Tensor,
              bias: torch.Tensor | None) -> torch.Tensor:
    out = torch._scaled_mm(x_q, w_q.t(), scale_a=x_scale, scale_b=w_scale.t(), out_dtype=torch.bfloat16)
    return out if bias is None else out + bias


def sqnr_db(approx: torch.Tensor, exact: torch.Tensor) -> float:
    noise = (approx.float() - exact.float()).pow(2).sum().item()
    return math.inf if noise == 0 else 10 * math.log10(exact.float().pow(2).sum().item() / noise)


def bench_gemm(case: str, m: int, n: int, k: int, bias: bool, autotune: bool = True, calls: int = 20,
               replays: int = 10, seed: int = 0) -> list[KernelTiming]:
    gen = torch.Generator(device="cuda").manual_seed(seed)
    x = torch.randn(m, k, device="cuda", generator=gen).to(torch.bfloat16)
    w = (torch.randn(n, k, device="cuda", generator=gen) / math.sqrt(k)).to(torch.bfloat16)
    b = torch.randn(n, device="cuda", generator=gen).to(torch.bfloat16) if bias else None
    work = (2.0 * m * n * k, 2.0 * (n * k + m * k + m * n))
    impls = {"cublas": lambda: F.linear(x, w, b)}
    copies = [w.clone() for _ in range(cold_copies(w.numel() * w.element_size()))]
    turn = itertools.count()
    impls["cublas, weights from HBM"] = lambda: F.linear(x, copies[next(turn) % len(copies)], b)
    if autotune:
        torch._dynamo.reset()  # a fresh cache a shape: past 8 recompiles of F.linear dynamo runs it eagerly
        tuned = torch.compile(F.linear, dynamic=False, options={  # max-autotune-no-cudagraphs, Triton only
            "max_autotune": True, "max_autotune_gemm_backends": "TRITON", "triton.cudagraphs": False})
        impls["triton autotuned"] = lambda: tuned(x, w, b)
    w_q, w_scale = quantize_rows(w)
    impls["fp8 rowwise"] = lambda: fp8_linear(x, w_q, w_scale, b)
    x_q, x_scale = quantize_rows(x)
    impls["fp8 rowwise, activation quantized"] = lambda: scaled_mm(x_q, x_scale, w_q, w_scale, b)
    expected = impls["cublas"]()
    rows = []
    for impl, fn in impls.items():
        try:
            got = fn()
            err = (got.float() - expected.float()).abs().max().item()
            name = f"{impl} (SQNR {sqnr_db(got, expected):.1f} dB)" if impl.startswith("fp8") else impl
            n_calls = max(calls, len(copies)) if "HBM" in impl else calls  # every copy in each replay
            rows.append(KernelTiming(case, name, gpu_time_us(fn, n_calls, replays), *work, err))
        except Exception as exc:  # one implementation failing (an unsupported shape) must not hide the rest
            print(f"{case}: {impl} failed: {type(exc).__name__}: {str(exc)[:200]}", file=sys.stderr)
    return rows


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m boundgen.bench.gemms", description=__doc__.split("\n\n")[0])
    parser.add_argument("--workloads", default="W2,W1", help="comma-separated: W2 (beam decode), W1 (scoring)")
    parser.add_argument("--no-autotune", action="store_true", help="skip the Triton max-autotune candidate")
    parser.add_argument("--json", help="write the timings here as JSON")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("error: GEMM benchmarks need a CUDA device", file=sys.stderr)
        return 2
    try:
        shapes = gemm_shapes(args.workloads.split(","))
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    rows = []
    for case, m, n, k, bias in shapes:
        rows += bench_gemm(case, m, n, k, bias, autotune=not args.no_autotune)
        print(f"{case}: " + ", ".join(f"{r.impl} {r.time_us:.1f} us" for r in rows if r.case == case), flush=True)
    print(markdown_table(rows))
    if args.json:
        with open(args.json, "w") as f:
            json.dump([asdict(r) for r in rows], f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
