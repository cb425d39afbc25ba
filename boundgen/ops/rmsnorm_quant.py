"""RMSNorm and the E4M3 rowwise quantization of its output, in one kernel: the FP8 qkv projection's
input in the first layer, whose input norm has no residual add before it (model/fp8.py, `--fp8
mlp,attn`; every later layer's goes through ops/add_rmsnorm_quant.py).

    x [T, H], weight [H], eps -> (q [T, H] float8_e4m3fn, scale [T, 1] FP32) with
    q, scale = e4m3.quantize_rows(rmsnorm.reference(x, weight, eps))

Why: the norm's kernel holds the whole row and can write it in E4M3 directly, instead of a bf16
row that a kernel of Inductor's reads once more to quantize. Not a lowering of its own: the model
calls it where the `add_rmsnorm_quant` lowering is "triton" and there is nothing to add
(ops/add_rmsnorm_quant.py `fused`).

Kernel: RMSNorm's with its QUANT path (ops/rmsnorm.py), the same rounding as ops/add_rmsnorm_quant.py
without the add. Bytes moved: x read (2 T H in bf16), q written (T H) and a 4-byte scale a row.
"""

import torch
from torch.library import triton_op

from boundgen.ops import rmsnorm
from boundgen.ops.e4m3 import E4M3, quantize_rows


def reference(x: torch.Tensor, weight: torch.Tensor, eps: float):
    return quantize_rows(rmsnorm.reference(x, weight, eps))


def launch(x: torch.Tensor, weight: torch.Tensor, eps: float, block_rows: int | None = None,
           num_warps: int | None = None):
    """The Triton kernel; same signature and result as `reference` (launch config for tests)."""
    return rmsnorm.launch(x, weight, eps, block_rows, num_warps, quantize=True)


# Registered op: one node under torch.export; the kernel on CUDA, the reference on CPU.

@triton_op("boundgen::rmsnorm_quant", mutates_args=())
def rmsnorm_quant(x: torch.Tensor, weight: torch.Tensor, eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    return launch(x, weight, eps)


rmsnorm_quant.register_kernel("cpu")(reference)


@rmsnorm_quant.register_fake
def _(x, weight, eps):
    return x.new_empty(x.shape, dtype=E4M3), x.new_empty((x.shape[0], 1), dtype=torch.float32)
