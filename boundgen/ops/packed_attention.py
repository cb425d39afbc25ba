"""Packed prefill attention: block-diagonal causal GQA attention over `cu_seqlens`.

Sequences are packed back to back, no padding: token i of the packed batch belongs to sequence
s with cu_seqlens[s] <= i < cu_seqlens[s+1], and attends to tokens j of the same sequence with
j <= i. Query head h reads K/V head h // (N_q / N_kv) (GQA, K/V never expanded).

    out[i, h] = sum_j softmax_j(scale * q[i, h] . k[j, h_kv]) v[j, h_kv]

Shapes: q [T, N_q, D], k/v [T, N_kv, D], cu_seqlens [B+1] int32 (cu_seqlens[0] = 0,
cu_seqlens[B] = T) -> out [T, N_q, D] in q's dtype. Softmax in FP32.
Bytes moved by a fused kernel: read q, k, v once per query block, write out; FLOPs
4 * D * N_q * sum_s L_s (L_s + 1) / 2.

`reference` materialises the [N_q, T, T] score matrix: it defines the semantics and is the
torch lowering; the Triton kernel (issue 6) never materialises scores.
"""

import torch


def sequence_ids(cu_seqlens: torch.Tensor, num_tokens: int) -> torch.Tensor:
    """[T] index of the sequence each packed token belongs to."""
    idx = torch.arange(num_tokens, device=cu_seqlens.device, dtype=cu_seqlens.dtype)
    return torch.searchsorted(cu_seqlens[1:], idx, right=True)


def reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens: torch.Tensor,
              scale: float) -> torch.Tensor:
    num_tokens, num_q_heads, head_dim = q.shape
    num_kv_heads = k.shape[1]
    group = num_q_heads // num_kv_heads
    qg = q.reshape(num_tokens, num_kv_heads, group, head_dim).to(torch.float32)  # [T, Nkv, G, D]
    scores = torch.einsum("ikgd,jkd->kgij", qg, k.to(torch.float32)) * scale  # [Nkv, G, T, T]
    seq = sequence_ids(cu_seqlens, num_tokens)
    idx = torch.arange(num_tokens, device=q.device)
    allowed = (seq[:, None] == seq[None, :]) & (idx[None, :] <= idx[:, None])  # [T, T]
    scores = scores.masked_fill(~allowed, float("-inf"))
    probs = torch.softmax(scores, dim=-1)
    out = torch.einsum("kgij,jkd->ikgd", probs, v.to(torch.float32))  # [T, Nkv, G, D]
    return out.reshape(num_tokens, num_q_heads, head_dim).to(q.dtype)


# Lowerings by name; the build config picks one per op and records it in the manifest.
IMPLEMENTATIONS = {"torch": reference}
