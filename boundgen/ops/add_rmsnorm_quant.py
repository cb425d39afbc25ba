"""The residual add, the next RMSNorm and the E4M3 rowwise quantization of its output, in one kernel:
the FP8 gate/up projection's input, and with `--fp8 mlp,attn` the qkv projection's (model/fp8.py).

    x [T, H], delta [T, H], weight [H], eps -> (h, q [T, H] float8_e4m3fn, scale [T, 1] FP32) with
    h, y = add_rmsnorm.reference(x, delta, weight, eps);  q, scale = e4m3.quantize_rows(y)

delta None (the first layer's input norm: nothing to add yet): h = x and (q, scale) of the plain
norm, by ops/rmsnorm_quant.py's op (`fused`, the lowering the model calls).

Why: in an FP8 build the norm's output is read once more to be quantized, by a kernel of
Inductor's after the Triton norm (7.8 us a W1 layer on the H200, 3.1% of an FP8 build's GPU
time, docs/benchmarks.md); the norm's kernel holds the whole row and can write it in E4M3
directly, half the bytes of the bf16 row it wrote before.

Lowerings: "separate" (the default: the model applies `add_rmsnorm` as lowered, then the FP8
linear quantizes) and "triton" (RMSNorm's kernel with its ADD and QUANT paths, ops/rmsnorm.py; the
registered op runs `reference` on CPU).
"""

import torch
from torch.library import triton_op

from boundgen.ops import add_rmsnorm, rmsnorm, rmsnorm_quant
from boundgen.ops.e4m3 import E4M3, quantize_rows


def reference(x: torch.Tensor, delta: torch.Tensor | None, weight: torch.Tensor, eps: float):
    if delta is None:
        return (x, *rmsnorm_quant.reference(x, weight, eps))
    h, y = add_rmsnorm.reference(x, delta, weight, eps)
    return (h, *quantize_rows(y))


def launch(x: torch.Tensor, delta: torch.Tensor | None, weight: torch.Tensor, eps: float,
           block_rows: int | None = None, num_warps: int | None = None):
    """The Triton kernel; same signature and result as `reference` (launch config for tests)."""
    if delta is None:
        return (x, *rmsnorm_quant.launch(x, weight, eps, block_rows, num_warps))
    return rmsnorm.launch(x, weight, eps, block_rows, num_warps, delta=delta, quantize=True)


# Registered op: one node under torch.export; the kernel on CUDA, the reference on CPU.

@triton_op("boundgen::add_rmsnorm_quant", mutates_args=())
def add_rmsnorm_quant(x: torch.Tensor, delta: torch.Tensor, weight: torch.Tensor,
                      eps: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return launch(x, delta, weight, eps)


add_rmsnorm_quant.register_kernel("cpu")(reference)


@add_rmsnorm_quant.register_fake
def _(x, delta, weight, eps):
    return x.new_empty(x.shape), x.new_empty(x.shape, dtype=E4M3), x.new_empty((x.shape[0], 1), dtype=torch.float32)


def fused(x: torch.Tensor, delta: torch.Tensor | None, weight: torch.Tensor, eps: float):
    """The "triton" lowering as the model calls it: `reference`'s signature, each case one
    registered op (a custom op's outputs may not alias its inputs, so h = x is returned here)."""
    if delta is None:
        return (x, *rmsnorm_quant.rmsnorm_quant(x, weight, eps))
    return add_rmsnorm_quant(x, delta, weight, eps)


# Lowerings by name; the build config picks one per op and records it in the manifest.
IMPLEMENTATIONS = {"separate": None, "triton": fused}
