"""Rounding FP32 values to a kernel's storage dtype the way torch rounds, interpreter included.

Elementwise kernels that reproduce torch's per-op rounding (`rmsnorm`, `rope`, `silu_mul`) cast
FP32 intermediates to bf16/fp16 with `round_to`. Compiled for the GPU that is a plain cast
(round to nearest even). The Triton interpreter (CPU) truncates FP32 -> bf16 casts instead
(triton 3.7.1 `InterpreterBuilder.cast_impl`; its "rtne" mode rounds ties up), so launchers pass
SOFT_BF16 = True for CPU tensors: the value is first rounded to the bf16 grid in FP32 by integer
arithmetic on its bits (ties to even; inf and NaN stay inf and NaN), after which truncation is
exact (the interpreter still mishandles FP32 subnormals, which no test input produces).
A kernel whose intermediate roundings must survive GPU compilation passes SOFT_BF16 = True on
the GPU too (ops/rope.py): a cast round trip FP32 -> bf16 -> FP32 may be folded away there.
`rounded` is such an intermediate: the value on the dtype's grid, kept in FP32, with no
conversion instruction on the soft path (a conversion issues at a quarter of the integer rate on
the H200; the fused q/k-norm + RoPE kernel was bound by its roundings).
`rounded_fp` is the same value from three FP32 operations instead of four integer ones (the
integer pipe runs at half the FP32 rate on the H200): Veltkamp's split, exact for finite
normal |x| < 2^111 on every device, and immune to FMA contraction (see its docstring).
"""

import triton
import triton.language as tl


@triton.jit
def round_to(x, dtype: tl.constexpr, SOFT_BF16: tl.constexpr):
    """x (FP32) rounded to nearest-even in `dtype`, returned in `dtype`."""
    if SOFT_BF16 and dtype == tl.bfloat16:
        bits = x.to(tl.uint32, bitcast=True)
        bits = (bits + (0x7FFF + ((bits >> 16) & 1))) & 0xFFFF0000
        x = bits.to(tl.float32, bitcast=True)
    return x.to(dtype)


@triton.jit
def rounded(x, dtype: tl.constexpr, SOFT_BF16: tl.constexpr):
    """x (FP32) rounded to nearest-even in `dtype`, returned in FP32: `round_to(x).to(float32)`."""
    if SOFT_BF16 and dtype == tl.bfloat16:
        bits = x.to(tl.uint32, bitcast=True)
        bits = (bits + (0x7FFF + ((bits >> 16) & 1))) & 0xFFFF0000
        return bits.to(tl.float32, bitcast=True)
    else:
        return x.to(dtype).to(tl.float32)


@triton.jit
def rounded_fp(x, dtype: tl.constexpr):
    """x (FP32: zero, or normal with |x| < 2^111) rounded to nearest-even bf16, returned in FP32,
    by Veltkamp's split on the FP32 pipe: g = RN(65537 x), h = RN(g - RN(g - x)) keeps x's 8
    leading bits, rounded to nearest, ties to even (every FP32 of that range checked against the
    bit rounding; an FP32 subnormal keeps 8 significant bits, where bf16 keeps fewer).
    g is written x * 2^16 + x so that a contraction into an FMA gives the same RN(65537 x), and
    g, being an addition, is no product for the later subtraction to contract with. Other
    dtypes: the cast round trip (`rounded` without SOFT_BF16)."""
    if dtype == tl.bfloat16:
        g = x * 65536.0 + x
        return g - (g - x)
    else:
        return x.to(dtype).to(tl.float32)
