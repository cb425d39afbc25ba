"""Distance in units in the last place between two bf16/fp16 tensors, for kernels whose rounding
matches torch's step by step: results should be equal or one ulp apart."""

import torch


def ulp_distance(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """|ordered(a) - ordered(b)| elementwise (int32), where ordered maps the 16-bit patterns of
    one dtype monotonically onto integers (+0 and -0 both 0)."""
    assert a.dtype == b.dtype and a.dtype in (torch.bfloat16, torch.float16), (a.dtype, b.dtype)

    def ordered(t):
        bits = t.contiguous().view(torch.int16).to(torch.int32)
        return torch.where(bits < 0, -(bits & 0x7FFF), bits)

    return (ordered(a.cpu()) - ordered(b.cpu())).abs()
