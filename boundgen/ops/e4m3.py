"""FP8 E4M3 rowwise quantization, the torch reference (model/fp8.py, ops/silu_quant.py).

    x [M, K] -> (q [M, K] float8_e4m3fn, scale [M, 1] FP32) with x ~= q * scale:
    scale = max(amax(|row|), 1e-12) / 448 (FP32), q = clamp(x / scale, -448, 448) rounded to E4M3
    (nearest even), one scale per row.
"""

import torch

E4M3 = torch.float8_e4m3fn
E4M3_MAX = 448.0
MIN_AMAX = 1e-12  # an all-zero row keeps a finite scale


def quantize_rows(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    scale = x.abs().amax(dim=1, keepdim=True).float().clamp(min=MIN_AMAX) / E4M3_MAX
    return (x.float() / scale).clamp(-E4M3_MAX, E4M3_MAX).to(E4M3), scale
