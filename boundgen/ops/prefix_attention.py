"""Shared-prefix beam attention: W decode queries over one prompt K/V plus per-beam suffix K/V.

Every beam of a request shares the prompt's K/V `[L_p, N_kv, D]`, stored once; each beam has its
own suffix K/V `[W, L_s, N_kv, D]` (the tokens it generated so far, including the current one).
The query of beam w attends to all L_p prefix positions and all L_s positions of its own suffix
in one softmax; no concatenation of K/V, no page table. GQA as in packed attention.

    out[w, h] = softmax over (prefix ++ suffix[w]) of scale * q[w, h] . k, applied to v

Shapes: q [W, N_q, D], k_prefix/v_prefix [L_p, N_kv, D], k_suffix/v_suffix [W, L_s, N_kv, D]
(L_s may be 0) -> out [W, N_q, D] in q's dtype. Softmax in FP32.
Bytes moved by a fused kernel: prefix K/V once per (beam, kv head) program, i.e.
W * L_p * N_kv * D * 2 * dtype bytes from L2/HBM, suffix K/V once, q and out once.
"""

import torch


def reference(q: torch.Tensor, k_prefix: torch.Tensor, v_prefix: torch.Tensor,
              k_suffix: torch.Tensor, v_suffix: torch.Tensor, scale: float) -> torch.Tensor:
    width, num_q_heads, head_dim = q.shape
    num_kv_heads = k_prefix.shape[1]
    group = num_q_heads // num_kv_heads
    prefix_len = k_prefix.shape[0]
    qg = q.reshape(width, num_kv_heads, group, head_dim).to(torch.float32)  # [W, Nkv, G, D]
    s_prefix = torch.einsum("wkgd,lkd->wkgl", qg, k_prefix.to(torch.float32))  # [W, Nkv, G, Lp]
    s_suffix = torch.einsum("wkgd,wskd->wkgs", qg, k_suffix.to(torch.float32))  # [W, Nkv, G, Ls]
    probs = torch.softmax(torch.cat((s_prefix, s_suffix), dim=-1) * scale, dim=-1)
    p_prefix, p_suffix = probs[..., :prefix_len], probs[..., prefix_len:]
    out = torch.einsum("wkgl,lkd->wkgd", p_prefix, v_prefix.to(torch.float32))
    out = out + torch.einsum("wkgs,wskd->wkgd", p_suffix, v_suffix.to(torch.float32))
    return out.reshape(width, num_q_heads, head_dim).to(q.dtype)


# Lowerings by name; the build config picks one per op and records it in the manifest.
IMPLEMENTATIONS = {"torch": reference}
