"""SwiGLU activation on the fused gate/up projection: y = silu(gate) * up.

x [T, 2I] holds gate = x[:, :I] and up = x[:, I:] (the layout of `gate_up_proj`'s output);
y [T, I] in x's dtype, contiguous. Bytes moved: read 2 T I, write T I elements. As in HF, silu and
the product are each rounded to the activation dtype.

Triton kernel: one program per (token block, column block of I), elementwise:
silu(g) = g / (1 + exp(-g)) in FP32 with an IEEE-rounded division, as torch computes it, rounded
to x's dtype; times up in FP32, rounded again. exp differs from torch's in the last FP32 bit at
times, so the rounded silu can be one ulp off, and the result (rarely) up to two ulp. x may have
any row stride (the last dim contiguous).
"""

import torch
import torch.nn.functional as F
import triton
import triton.language as tl
from torch.library import triton_op, wrap_triton

from boundgen.ops.rounding import round_to


def reference(x: torch.Tensor) -> torch.Tensor:
    gate, up = x.chunk(2, dim=-1)
    return F.silu(gate) * up


# ---------------------------------------------------------------------------------------------
# Triton kernel

@triton.jit
def _silu_mul_kernel(x_ptr, out_ptr, num_tokens, stride_xt, INTER: tl.constexpr,
                     BLOCK_T: tl.constexpr, BLOCK_I: tl.constexpr, SOFT_BF16: tl.constexpr):
    dtype = x_ptr.dtype.element_ty
    tokens = (tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)).to(tl.int64)
    cols = tl.program_id(1) * BLOCK_I + tl.arange(0, BLOCK_I)
    mask = (tokens < num_tokens)[:, None] & (cols < INTER)[None, :]  # [T, I]
    gate_at = x_ptr + tokens[:, None] * stride_xt + cols[None, :]
    gate = tl.load(gate_at, mask=mask, other=0.0).to(tl.float32)
    up = tl.load(gate_at + INTER, mask=mask, other=0.0).to(tl.float32)
    silu = round_to(tl.div_rn(gate, 1.0 + tl.exp(-gate)), dtype, SOFT_BF16)
    y = silu.to(tl.float32) * up
    tl.store(out_ptr + tokens[:, None] * INTER + cols[None, :], round_to(y, dtype, SOFT_BF16),
             mask=mask)


# ---------------------------------------------------------------------------------------------
# Launcher

SUPPORTED_DTYPES = (torch.bfloat16, torch.float16, torch.float32)


def _check(x: torch.Tensor) -> None:
    if x.dim() != 2 or x.shape[1] % 2:
        raise ValueError(f"silu_mul: expected x [T, 2I] (gate then up); got shape {tuple(x.shape)}")
    if x.dtype not in SUPPORTED_DTYPES:
        raise ValueError(f"silu_mul: x must be bfloat16, float16 or float32; got {x.dtype}")
    if x.stride(1) != 1:
        raise ValueError(f"silu_mul: the last dim of x must be contiguous (stride 1); got "
                         f"strides {x.stride()}")


def default_config(inter: int) -> tuple[int, int, int]:
    """(BLOCK_T, BLOCK_I, num_warps): up to 1024 columns and ~4K output elements per program
    (Qwen3-0.6B I 3072: 3 column blocks of 4 tokens). Fixed, not autotuned: deterministic builds."""
    block_i = min(1024, triton.next_power_of_2(inter))
    return max(1, min(64, 4096 // block_i)), block_i, 4


def launch(x: torch.Tensor, block_t: int | None = None, block_i: int | None = None,
           num_warps: int | None = None) -> torch.Tensor:
    """Run the Triton kernel; same signature and result as `reference`. The launch config is
    overridable for tests (small blocks exercise many programs on tiny inputs) and benchmarks."""
    _check(x)
    num_tokens, inter = x.shape[0], x.shape[1] // 2
    default_t, default_i, default_warps = default_config(inter)
    block_t, block_i = block_t or default_t, block_i or default_i
    num_warps = num_warps or default_warps
    out = torch.empty((num_tokens, inter), dtype=x.dtype, device=x.device)
    grid = (triton.cdiv(num_tokens, block_t), triton.cdiv(inter, block_i))
    wrap_triton(_silu_mul_kernel)[grid](
        x, out, num_tokens, x.stride(0), INTER=inter, BLOCK_T=block_t, BLOCK_I=block_i,
        SOFT_BF16=x.device.type == "cpu", num_warps=num_warps)
    return out


# ---------------------------------------------------------------------------------------------
# Registered op: one node under torch.export; the kernel on CUDA, the reference on CPU.

@triton_op("boundgen::silu_mul", mutates_args=())
def silu_mul(x: torch.Tensor) -> torch.Tensor:
    return launch(x)


silu_mul.register_kernel("cpu")(reference)


@silu_mul.register_fake
def _(x):
    return x.new_empty((x.shape[0], x.shape[1] // 2))


# Lowerings by name; the build config picks one per op and records it in the manifest.
IMPLEMENTATIONS = {"torch": reference, "triton": silu_mul}
