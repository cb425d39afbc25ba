"""The residual add and the next RMSNorm, in one kernel.

    x [T, H], delta [T, H], weight [H], eps -> (h, y) with
    h = x + delta           (in x's dtype, as torch adds: FP32 sum rounded once)
    y = rmsnorm(h, weight, eps)   (ops/rmsnorm.py; `reference` below is exactly that composition)

delta may also be FP32 partial products [S, T, H] of a split-K projection (ops/swiglu_down.py):
they are summed in order and rounded to x's dtype first (`swiglu_down.total`), as the GEMM they
replace would have stored its product.

Why: a decoder layer adds each block's output to the residual stream and normalises the sum for
the next block. With the norm an opaque op (the Triton RMSNorm), Inductor puts the add in the
GEMM's epilogue instead (cuBLAS addmm with beta = 1), and PyTorch first copies the residual into
the GEMM's output buffer: two D2D copies a layer (`memcpy128`, 7.3 us each in the W1 profile of
2026-12-01). Here the GEMM writes delta alone and one kernel reads x and delta once, writes h and y.

Lowerings: "separate" (the default: no fused op, the model adds, then applies `rmsnorm` as it is
lowered) and "triton" (the RMSNorm kernel with its ADD path, ops/rmsnorm.py; the registered op
runs `reference` on CPU).
"""

import torch
from torch.library import triton_op

from boundgen.ops import rmsnorm, swiglu_down


def reference(x: torch.Tensor, delta: torch.Tensor, weight: torch.Tensor, eps: float):
    if delta.dim() == 3:
        delta = swiglu_down.total(delta, x.dtype)
    h = x + delta
    return h, rmsnorm.reference(h, weight, eps)


def launch(x: torch.Tensor, delta: torch.Tensor, weight: torch.Tensor, eps: float, block_rows: int | None = None,
           num_warps: int | None = None):
    """The Triton kernel; same signature and result as `reference` (launch config for tests)."""
    return rmsnorm.launch(x, weight, eps, block_rows, num_warps, delta=delta)


# Registered op: one node under torch.export; the kernel on CUDA, the reference on CPU.

@triton_op("boundgen::add_rmsnorm", mutates_args=())
def add_rmsnorm(x: torch.Tensor, delta: torch.Tensor, weight: torch.Tensor,
                eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    return launch(x, delta, weight, eps)


add_rmsnorm.register_kernel("cpu")(reference)


@add_rmsnorm.register_fake
def _(x, delta, weight, eps):
    return x.new_empty(x.shape), x.new_empty(x.shape)


# Lowerings by name; the build config picks one per op and records it in the manifest.
IMPLEMENTATIONS = {"separate": None, "triton": add_rmsnorm}
