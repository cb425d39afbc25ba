"""SwiGLU and its E4M3 rowwise quantization in one pass: the FP8 down projection's input.

    x [T, 2I] (gate then up) -> (q [T, I] float8_e4m3fn, scale [T, 1] FP32)
    = e4m3.quantize_rows(silu_mul.reference(x))   (`reference` below)

Why: in an FP8 build (model/fp8.py) the down projection takes its input in E4M3 rows. Left to
Inductor, SwiGLU, the row's amax and the cast become one looped reduction that reads the [T, 2I]
gate/up output twice (28.6 us a W1 layer on the H200, 11% of the GPU time of an FP8 build,
docs/benchmarks.md), where SwiGLU alone took 19.5 us. Here one program holds whole rows in
registers: one read of gate and up, one write of the E4M3 row and its scale.

Triton kernel: one program per BLOCK_T rows, a row's I columns in two power-of-two parts held in
registers (I 3,072: 2,048 + 1,024; `parts`), so that no lane is padded (one block of 4,096 had a
quarter of its lanes masked, each still computing exp and the division). silu and the product
rounded to x's dtype as ops/silu_mul.py rounds them (HF's rounding), the amax of the rounded
product over both parts, scale = max(amax, 1e-12) / 448 and q = clamp(act / scale, +-448), cast to
E4M3 (nearest even). On CPU the divisions are IEEE, as torch's: equal to the reference but where
the exp differs in its last FP32 bit. On the GPU silu's division is approximate and q is act times
the row's reciprocal scale: with IEEE divisions for every element the kernel took 44.7 us a W1
layer on the H200 against 28.6 for Inductor's two-pass version (2026-12-01), though it moves
half the bytes; the fast form takes 19.1 us against Inductor's 31.9 in the same run (0e668eb,
docs/benchmarks.md: W1 228.0 against 216.0 QPS with it and add_rmsnorm_quant). Under the interpreter
the cast to E4M3 rounds wrongly when the rounding carries into the exponent (TOOLCHAIN.md), so
on CPU the value is first rounded onto the E4M3 grid in FP32.
Bytes moved: gate and up read once (2 I x 2 B a bf16 row), q written (I B) and the scale (4 B):
15.4 KB a W1 row. Block sizes (default_config): one row a program at 4 warps for I 3,072, 24
columns a thread (two 16-byte loads of part 1, one of part 2, each of gate and up): 2,976 SASS
instructions a row against 4,416 for one row of 4,096 lanes at 8 warps (28a37ab); fixed from the
shapes, timed against others by `bench.kernels --memory-bound --sweep`.
"""

import torch
import triton
import triton.language as tl
from torch.library import triton_op, wrap_triton

from boundgen.ops import silu_mul
from boundgen.ops.e4m3 import E4M3, quantize_rows, quantize_values, row_scale
from boundgen.ops.rounding import rounded


def reference(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return quantize_rows(silu_mul.reference(x))


# ---------------------------------------------------------------------------------------------
# Triton kernel

@triton.jit
def _swiglu_part(x_ptr, rows, row_ok, stride_xt, FIRST: tl.constexpr, WIDTH: tl.constexpr, INTER: tl.constexpr,
                 SOFT_BF16: tl.constexpr, IEEE_DIV: tl.constexpr):
    """Columns FIRST .. FIRST + WIDTH of the rows' SwiGLU, rounded as silu_mul rounds, 0 past I
    -> (act [R, WIDTH] FP32, its column mask)."""
    dtype = x_ptr.dtype.element_ty
    cols = FIRST + tl.arange(0, WIDTH)
    mask = row_ok[:, None] & (cols < INTER)[None, :]
    gate_at = x_ptr + rows[:, None] * stride_xt + cols[None, :]
    gate = tl.load(gate_at, mask=mask, other=0.0).to(tl.float32)
    up = tl.load(gate_at + INTER, mask=mask, other=0.0).to(tl.float32)
    if IEEE_DIV:
        silu = tl.div_rn(gate, 1.0 + tl.exp(-gate))
    else:  # an approximate division: its last FP32 bits rarely survive the rounding to x's dtype
        silu = gate / (1.0 + tl.exp(-gate))
    return rounded(rounded(silu, dtype, SOFT_BF16) * up, dtype, SOFT_BF16), mask  # 0 where masked


@triton.jit
def _silu_quant_kernel(x_ptr, q_ptr, scale_ptr, num_rows, stride_xt, INTER: tl.constexpr, BLOCK_T: tl.constexpr,
                       PART1: tl.constexpr, PART2: tl.constexpr, SOFT_BF16: tl.constexpr, IEEE_DIV: tl.constexpr):
    # A row's I columns in two power-of-two parts, PART1 + PART2 >= I (I 3,072: 2,048 + 1,024, no
    # padded lane; one block of 4,096 left a quarter of its lanes masked), held in registers until
    # the row's amax is known: one read of gate and up, one write of q and the scale.
    rows = (tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)).to(tl.int64)
    row_ok = rows < num_rows
    act1, mask1 = _swiglu_part(x_ptr, rows, row_ok, stride_xt, 0, PART1, INTER, SOFT_BF16, IEEE_DIV)
    amax = tl.max(tl.abs(act1), axis=1)
    if PART2 > 0:
        act2, mask2 = _swiglu_part(x_ptr, rows, row_ok, stride_xt, PART1, PART2, INTER, SOFT_BF16, IEEE_DIV)
        amax = tl.maximum(amax, tl.max(tl.abs(act2), axis=1))
    scale = row_scale(amax)
    q_row = q_ptr + rows[:, None] * INTER
    q1 = quantize_values(act1, scale, SOFT_BF16, IEEE_DIV)
    tl.store(q_row + tl.arange(0, PART1)[None, :], q1.to(q_ptr.dtype.element_ty), mask=mask1)
    if PART2 > 0:
        q2 = quantize_values(act2, scale, SOFT_BF16, IEEE_DIV)
        tl.store(q_row + PART1 + tl.arange(0, PART2)[None, :], q2.to(q_ptr.dtype.element_ty), mask=mask2)
    tl.store(scale_ptr + rows, scale, mask=row_ok)


# ---------------------------------------------------------------------------------------------
# Launcher

SUPPORTED_DTYPES = (torch.bfloat16, torch.float16, torch.float32)


def parts(inter: int) -> tuple[int, int]:
    """(PART1, PART2): the largest power of two <= I, then the rest's power of two (0 if none):
    3,072 -> 2,048 + 1,024; 4,864 -> 4,096 + 1,024 (5% padded, where one block pads 68%)."""
    part1 = 1 << (inter.bit_length() - 1)
    return part1, (triton.next_power_of_2(inter - part1) if inter > part1 else 0)


def default_config(inter: int) -> tuple[int, int]:
    """(BLOCK_T, num_warps): rows for ~4K columns a program (I 3,072: one row), 4 warps up to 4K
    (24 columns a thread: 16-byte loads of gate and up, 2 of part 1 and 1 of part 2), 8 beyond.
    Fixed, not autotuned: deterministic builds."""
    block_t = max(1, 4096 // triton.next_power_of_2(inter))
    return block_t, (4 if block_t * inter <= 4096 else 8)


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
        x, q, scale, num_rows, x.stride(0), INTER=inter, BLOCK_T=block_t, PART1=parts(inter)[0], PART2=parts(inter)[1],
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
