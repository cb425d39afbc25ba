"""Rotary position embedding (rotate-half form, as HF Qwen2/Qwen3).

inv_freq[i] = 1 / theta^(2i / D); angle[t, i] = position[t] * inv_freq[i] in FP32;
cos/sin [T, D] = cos/sin(cat(angle, angle)) cast to the activation dtype;
y = x * cos + rotate_half(x) * sin with rotate_half(x) = cat(-x[..., D/2:], x[..., :D/2]).
x [T, N, D]. Bytes moved: read x, cos, sin; write y.
"""

import torch


def inv_freq(head_dim: int, theta: float) -> torch.Tensor:
    """[D/2] FP32, computed as HF computes it (int64 arange -> float, then divide)."""
    exponent = torch.arange(0, head_dim, 2, dtype=torch.int64).to(torch.float32) / head_dim
    return 1.0 / (theta ** exponent)


def cos_sin(positions: torch.Tensor, inv_freq: torch.Tensor, dtype: torch.dtype):
    """positions [T] int -> (cos, sin) each [T, D] in `dtype`."""
    angles = positions.to(torch.float32)[:, None] * inv_freq[None, :]  # [T, D/2]
    emb = torch.cat((angles, angles), dim=-1)  # [T, D]
    return emb.cos().to(dtype), emb.sin().to(dtype)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def reference(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [T, N, D], cos/sin [T, D] -> [T, N, D]."""
    cos = cos[:, None, :]
    sin = sin[:, None, :]
    return x * cos + _rotate_half(x) * sin


# Lowerings by name; the build config picks one per op and records it in the manifest.
IMPLEMENTATIONS = {"torch": reference}
