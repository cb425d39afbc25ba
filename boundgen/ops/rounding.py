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
fp16 gets the same treatment (`rounded_fp16`): its cast round trip is no safer from folding than
bf16's, so `rounded` on the soft path and `rounded_fp` round fp16 in FP32 arithmetic too.
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
    elif SOFT_BF16 and dtype == tl.float16:
        return rounded_fp16(x)
    else:
        return x.to(dtype).to(tl.float32)


@triton.jit
def rounded_fp16(x):
    """x (FP32, |x| < 65520: fp16's finite range) rounded to nearest-even fp16, returned in FP32, in
    FP32 arithmetic that no compiler fold removes: Veltkamp's split with 2^13 + 1 keeps 11
    significant bits (fp16's normal numbers); below 2^-14, where fp16 is subnormal and its grid is
    2^-24 whatever the magnitude, RN(x + 0.75) - 0.75 rounds to that grid (0.75's FP32 ulp is 2^-24,
    its last bit even, so ties go to even as fp16's do). As `rounded_fp`, g is written as a sum."""
    g = x * 8192.0 + x
    normal = g - (g - x)
    subnormal = (x + 0.75) - 0.75
    subnormal = tl.where(subnormal == 0.0, x * 0.0, subnormal)  # a zero keeps x's sign, as the cast's
    return tl.where(tl.abs(x) < 6.103515625e-05, subnormal, normal)


@triton.jit
def rounded_fp(x, dtype: tl.constexpr):
    """x (FP32: zero, or normal with |x| < 2^111) rounded to nearest-even bf16, returned in FP32,
    by Veltkamp's split on the FP32 pipe: g = RN(65537 x), h = RN(g - RN(g - x)) keeps x's 8
    leading bits, rounded to nearest, ties to even (every FP32 of that range checked against the
    bit rounding; an FP32 subnormal keeps 8 significant bits, where bf16 keeps fewer).
    g is written x * 2^16 + x so that a contraction into an FMA gives the same RN(65537 x), and
    g, being an addition, is no product for the later subtraction to contract with. fp16:
    `rounded_fp16`; FP32: x."""
    if dtype == tl.bfloat16:
        g = x * 65536.0 + x
        return g - (g - x)
    elif dtype == tl.float16:
        return rounded_fp16(x)
    else:
        return x.to(dtype).to(tl.float32)
