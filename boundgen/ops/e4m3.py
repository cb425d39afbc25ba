"""FP8 E4M3 rowwise quantization: the torch reference (`quantize_rows`: model/fp8.py, the ops'
references, bench/gemms.py) and its Triton form for kernels that hold whole rows (`quantize_block`:
the QUANT path of ops/rmsnorm.py; `row_scale` and `quantize_values` for a row held in parts:
ops/silu_quant.py).

    x [M, K] -> (q [M, K] float8_e4m3fn, scale [M, 1] FP32) with x ~= q * scale:
    scale = max(amax(|row|), 1e-12) / 448 (FP32), q = clamp(x / scale, -448, 448) rounded to E4M3
    (nearest even), one scale per row.
"""

import torch
import triton
import triton.language as tl

E4M3 = torch.float8_e4m3fn
E4M3_MAX = 448.0
MIN_AMAX = 1e-12  # an all-zero row keeps a finite scale


def quantize_rows(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    scale = x.abs().amax(dim=1, keepdim=True).float().clamp(min=MIN_AMAX) / E4M3_MAX
    return (x.float() / scale).clamp(-E4M3_MAX, E4M3_MAX).to(E4M3), scale


@triton.jit
def to_e4m3_grid(v):
    """v (FP32, |v| <= 448) rounded to the nearest E4M3 value (ties to even), kept in FP32: an
    ulp of 2^(max(e, -6) - 3) for v = m 2^e, rounded by the FP32 add of 1.5 x 2^23. Kernels apply
    it before their cast to E4M3 under the interpreter, whose own cast rounds wrongly when the
    rounding carries into the exponent (TOOLCHAIN.md)."""
    bits = v.to(tl.uint32, bitcast=True)
    exponent = ((bits >> 23) & 0xFF).to(tl.int32) - 127
    ulp_bits = ((tl.maximum(exponent, -6) - 3 + 127) << 23).to(tl.uint32)
    ulp = ulp_bits.to(tl.float32, bitcast=True)
    return ((v / ulp + 12582912.0) - 12582912.0) * ulp


# Written out in `row_scale` and `quantize_values`: a build compiles Inductor's copy of a kernel, which takes its
# helper functions along but not this module's globals (tests/ops/test_sm90_compile.py).
assert (E4M3_MAX, MIN_AMAX) == (448.0, 1e-12), "row_scale and quantize_values write them out"


@triton.jit
def quantize_block(v, SOFT_BF16: tl.constexpr, IEEE_DIV: tl.constexpr):
    """v [R, C] FP32 (whole rows; 0 where masked) -> (q [R, C] FP32 on the E4M3 grid where it
    matters, for the caller's cast; scale [R] FP32), as `quantize_rows`. IEEE_DIV: q = v / scale
    as torch divides; else v times the row's reciprocal scale (one division a row, an E4M3 ulp
    apart at times). SOFT_BF16 (the interpreter): q rounded onto the E4M3 grid before the cast."""
    scale = row_scale(tl.max(tl.abs(v), axis=1))
    return quantize_values(v, scale, SOFT_BF16, IEEE_DIV), scale


@triton.jit
def row_scale(amax):
    """A row's amax [R] (FP32) -> its scale [R], as `quantize_rows`: max(amax, 1e-12) / 448."""
    amax = tl.maximum(amax, 1e-12)
    return tl.div_rn(amax, tl.full(amax.shape, 448.0, tl.float32))


@triton.jit
def quantize_values(v, scale, SOFT_BF16: tl.constexpr, IEEE_DIV: tl.constexpr):
    """v [R, C] FP32, part or all of rows whose scale [R] is known -> q [R, C] FP32 for the
    caller's cast to E4M3, as `quantize_block` (which is this with the whole row's scale)."""
    if IEEE_DIV:
        q = tl.div_rn(v, scale[:, None])
    else:
        q = v * tl.div_rn(tl.full(scale.shape, 1.0, tl.float32), scale)[:, None]
    q = tl.minimum(tl.maximum(q, -448.0), 448.0)
    if SOFT_BF16:
        q = to_e4m3_grid(q)
    return q
