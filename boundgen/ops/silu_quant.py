"""SwiGLU and its E4M3 rowwise quantization in one pass: the FP8 down projection's input.

    x [T, 2I] (gate then up) -> (q [T, I] float8_e4m3fn, scale [T, 1] FP32)
    = e4m3.quantize_rows(silu_mul.reference(x))   (`reference` below)

Why: in an FP8 build (model/fp8.py) the down projection takes its input in E4M3 rows. Left to
Inductor, SwiGLU, the row's amax and the cast become one looped reduction that reads the [T, 2I]
gate/up output twice (28.6 us a W1 layer on the H200, 11% of the GPU time of an FP8 build,
docs/benchmarks.md), where SwiGLU alone took 19.5 us. Here one program holds whole rows in
registers: one read of gate and up, one write of the E4M3 row and its scale.

Triton kernel: one program per BLOCK_T rows, the row's I columns in one block. silu and the
product rounded to x's dtype as ops/silu_mul.py rounds them (HF's rounding), the amax of the
rounded product, scale = max(amax, 1e-12) / 448 and q = clamp(act / scale, +-448), cast to E4M3
(nearest even). On CPU the divisions are IEEE, as torch's: equal to the reference but where the
exp differs in its last FP32 bit. On the GPU silu's division is approximate and q is act times
the row's reciprocal scale: with IEEE divisions for every element the kernel took 44.7 us a W1
layer on the H200 against 28.6 for Inductor's two-pass version (2026-12-01), though it moves
half the bytes; the fast form takes 19.1 us against Inductor's 31.9 in the same run (0e668eb,
docs/benchmarks.md: W1 228.0 against 216.0 QPS with it and add_rmsnorm_quant). Under the interpreter
the cast to E4M3 rounds wrongly when the rounding carries into the exponent (TOOLCHAIN.md), so
on CPU the value is first rounded onto the E4M3 grid in FP32.
"""

import torch
import triton
import triton.language as tl
from torch.library import triton_op, wrap_triton

from boundgen.ops import silu_mul
from boundgen.ops.e4m3 import E4M3, quantize_block, quantize_rows
from boundgen.ops.rounding import rounded


def reference(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return quantize_rows(silu_mul.reference(x))


# ---------------------------------------------------------------------------------------------
# Triton kernel

@triton.jit
def _silu_quant_kernel(x_ptr, q_ptr, scale_ptr, num_rows, stride_xt, INTER: tl.constexpr, BLOCK_T: tl.constexpr,
                       BLOCK_I: tl.constexpr, SOFT_BF16: tl.constexpr, IEEE_DIV: tl.constexpr):
    dtype = x_ptr.dtype.element_ty
    rows = (tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)).to(tl.int64)
    cols = tl.arange(0, BLOCK_I)
    mask = (rows < num_rows)[:, None] & (cols < INTER)[None, :]
    gate_at = x_ptr + rows[:, None] * stride_xt + cols[None, :]
    gate = tl.load(gate_at, mask=mask, other=0.0).to(tl.float32)
    up = tl.load(gate_at + INTER, mask=mask, other=0.0).to(tl.float32)
    if IEEE_DIV:
        silu = tl.div_rn(gate, 1.0 + tl.exp(-gate))
    else:  # an approximate division: its last FP32 bits rarely survive the rounding to x's dtype
        silu = gate / (1.0 + tl.exp(-gate))
    act = rounded(rounded(silu, dtype, SOFT_BF16) * up, dtype, SOFT_BF16)  # 0 where masked
    q, scale = quantize_block(act, SOFT_BF16, IEEE_DIV)
    tl.store(q_ptr + rows[:, None] * INTER + cols[None, :], q.to(q_ptr.dtype.element_ty), mask=mask)
    tl.store(scale_ptr + rows, scale, mask=rows < num_rows)


# ---------------------------------------------------------------------------------------------
# Launcher

SUPPORTED_DTYPES = (torch.bfloat16, torch.float16, torch.float32)


def default_config(inter: int) -> tuple[int, int]:
    """(BLOCK_T, num_warps): one row a program, its I columns in one block (I 3,072: 4,096 lanes,
    16 a thread at 8 warps). Fixed, not autotuned: deterministic builds."""
    return 1, (8 if triton.next_power_of_2(inter) >= 2048 else 4)


def launch(x: torch.Tensor, block_t: int | None = None, num_warps: int | None = None, ieee_div: bool | None = None):
    """Run the Triton kernel; same signature and result as `reference` (launch config for tests).
    `ieee_div` (default: on CPU only) divides as torch does, element by element; else silu's
    division is approximate and the quantization multiplies by the row's reciprocal scale: an
    E4M3 or bf16 ulp apart from the reference at times, and fast on the GPU."""
    if x.dim() != 2 or x.shape[1] % 2:
        raise ValueError(f"silu_quant: expected x [T, 2I] (gate then up); got shape {tuple(x.shape)}")
    if x.dtype not in SUPPORTED_DTYPES:
        raise ValueError(f"silu_quant: x must be bfloat16, float16 or float32; got {x.dtype}")
    if x.stride(1) != 1:
        raise ValueError(f"silu_quant: the last dim of x must be contiguous (stride 1); got strides {x.stride()}")
    num_rows, inter = x.shape[0], x.shape[1] // 2
    default_t, default_warps = default_config(inter)
    block_t, num_warps = block_t or default_t, num_warps or default_warps
    q = torch.empty((num_rows, inter), dtype=E4M3, device=x.device)
    scale = torch.empty((num_rows, 1), dtype=torch.float32, device=x.device)
    wrap_triton(_silu_quant_kernel)[(triton.cdiv(num_rows, block_t),)](
        x, q, scale, num_rows, x.stride(0), INTER=inter, BLOCK_T=block_t, BLOCK_I=triton.next_power_of_2(inter),
        SOFT_BF16=x.device.type == "cpu", IEEE_DIV=x.device.type == "cpu" if ieee_div is None else ieee_div,
        num_warps=num_warps)
    return q, scale


# ---------------------------------------------------------------------------------------------
# Registered op: one node under torch.export; the kernel on CUDA, the reference on CPU.

@triton_op("boundgen::silu_quant", mutates_args=())
def silu_quant(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return launch(x)


silu_quant.register_kernel("cpu")(reference)


@silu_quant.register_fake
def _(x):
    return x.new_empty((x.shape[0], x.shape[1] // 2), dtype=E4M3), x.new_empty((x.shape[0], 1), dtype=torch.float32)


# Lowerings by name; the build config picks one per op and records it in the manifest. "separate":
# no fused op, the model quantizes `silu_mul`'s output (Inductor compiles the two together).
IMPLEMENTATIONS = {"separate": None, "triton": silu_quant}
