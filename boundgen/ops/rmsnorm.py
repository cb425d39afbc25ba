"""RMSNorm: y = w * (x / sqrt(mean(x^2) + eps)), statistics in FP32, as HF Qwen2RMSNorm.

x [T, H] (or [T, N, D] for the per-head q/k norm of Qwen3), w [H]. Bytes moved: read x and w,
write y. The normalised value is cast back to the input dtype before the weight multiply,
exactly as HF does, so that bf16 results match the peer bit for bit in the common case.
"""

import torch


def reference(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    dtype = x.dtype
    h = x.to(torch.float32)
    variance = h.pow(2).mean(-1, keepdim=True)
    h = h * torch.rsqrt(variance + eps)
    return weight * h.to(dtype)


# Lowerings by name; the build config picks one per op and records it in the manifest.
IMPLEMENTATIONS = {"torch": reference}
