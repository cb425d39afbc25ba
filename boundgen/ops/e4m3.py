"""FP8 E4M3 rowwise quantization, the torch reference (model/fp8.py, ops/silu_quant.py).

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
